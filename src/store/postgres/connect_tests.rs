//! The order in which the store tries its hosts.

#![allow(clippy::unwrap_used)]

use super::*;

fn connector(hosts: &[&str]) -> Connector {
    let configs = hosts
        .iter()
        .map(|h| format!("postgres://u@{h}:5432/db").parse().unwrap())
        .collect();
    let tls = crate::tls::postgres_client_config(crate::tls::PgCheck::Nothing, None, None).unwrap();
    Connector::new(
        "pool",
        configs,
        PgTlsConnect::new(tls),
        Duration::from_secs(1),
        Duration::from_secs(2),
    )
}

fn order(c: &Connector) -> Vec<&str> {
    let order = c.order.lock().unwrap().clone();
    order.iter().map(|i| c.hosts[*i].label.as_str()).collect()
}

fn fails(c: &Connector, i: usize, silent: bool) {
    c.hosts[i].silent.store(silent, Ordering::Relaxed);
    c.to_back(i);
}

/// A host that failed goes behind the others; a silent one behind every host, one that
/// answered with an error (a standby) before the silent ones.
#[test]
fn failed_hosts_go_to_the_back_silent_ones_last() {
    let c = connector(&["a", "b", "c"]);
    assert_eq!(order(&c), ["a:5432", "b:5432", "c:5432"]);
    fails(&c, 0, true);
    assert_eq!(order(&c), ["b:5432", "c:5432", "a:5432"]);
    fails(&c, 1, false);
    assert_eq!(order(&c), ["c:5432", "b:5432", "a:5432"]);
    fails(&c, 2, false);
    assert_eq!(order(&c), ["b:5432", "c:5432", "a:5432"]);
    // The silent host answered again (with an error): no longer behind the rest for
    // being silent, but still behind the host that last answered.
    fails(&c, 0, false);
    assert_eq!(order(&c), ["b:5432", "c:5432", "a:5432"]);
    let single = connector(&["only"]);
    fails(&single, 0, true);
    assert_eq!(order(&single), ["only:5432"]);
}
