//! The `LISTEN` connection: one per process, outside the pool, waking the duplicates that
//! wait (`on_conflict: wait`) when any replica completes or releases their key, and
//! dropping a key from the replay cache when any replica evicts it.
//!
//! It must reach PostgreSQL directly: a transaction-mode pooler hands each statement to
//! some server connection and drops notifications, so behind one it goes to
//! `store.postgres.listen_url` (and without it, waiting duplicates fall back to their
//! periodic re-check).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::AsyncMessage;

use super::connect::Connector;
use crate::store::Waiters;
use crate::store::replay_cache::ReplayCache;
use crate::store::types::KeyId;

/// How often the `LISTEN` connection checks that its server still answers and is the
/// primary.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// The channel every replica notifies on when a key is completed or released.
pub(super) const CHANNEL: &str = "idemproxy_done";
/// The channel every replica notifies on when an operator evicts a key.
pub(super) const EVICTED: &str = "idemproxy_evicted";

/// Keeps one `LISTEN` connection open for the life of the process, reconnecting with
/// backoff, and wakes the waiters each notification names. After every (re)connect all
/// waiters are woken once and the replay cache is emptied, since notifications may have
/// been missed meanwhile; while disconnected the cache serves nothing.
pub(super) async fn listen(
    connector: Connector,
    waiters: Arc<Waiters>,
    cache: Option<Arc<ReplayCache>>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Made as the pool's connections are: each host and address bounded, a host that
        // accepts and never answers (a frozen primary) tried last from then on.
        match connector.open().await {
            Ok((client, mut connection, _)) => {
                let drive = async {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let Some(id) = parse_key_id(n.payload()) else {
                                    continue;
                                };
                                if n.channel() == EVICTED {
                                    if let Some(cache) = &cache {
                                        cache.invalidate(&id);
                                    }
                                } else {
                                    waiters.wake(&id);
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(cause = %e, "notification connection failed; reconnecting");
                                return;
                            }
                            None => return,
                        }
                    }
                };
                tokio::pin!(drive);
                let statement = format!("LISTEN {CHANNEL}; LISTEN {EVICTED}");
                let listening = tokio::select! {
                    r = client.batch_execute(&statement) => r.is_ok(),
                    () = &mut drive => false,
                };
                if listening {
                    backoff = Duration::from_millis(100);
                    waiters.wake_all();
                    if let Some(cache) = &cache {
                        cache.set_live(true);
                    }
                    tokio::select! {
                        () = &mut drive => {}
                        why = heartbeat(&client, &connector) => {
                            tracing::warn!(cause = %why, "notification connection no longer reaches the primary; reconnecting");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(cause = %e, "cannot open the notification connection; retrying")
            }
        }
        if let Some(cache) = &cache {
            cache.set_live(false);
        }
        waiters.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Resolves when the `LISTEN` connection stops being worth keeping: its server stopped
/// answering (a vanished host holds an idle connection open without a word, and TCP
/// keepalives do not help behind a proxy that answers them), or turned read-only when the
/// URL asks for the primary (notifications are sent on the primary only).
async fn heartbeat(client: &tokio_postgres::Client, connector: &Connector) -> String {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let check = client.simple_query("SHOW transaction_read_only");
        match tokio::time::timeout(connector.per_address, check).await {
            Ok(Ok(messages)) => {
                let read_only = messages.iter().any(|m| {
                    matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("on"))
                });
                if read_only && connector.wants_primary() {
                    return "the server is read-only now (demoted, or a standby)".to_owned();
                }
            }
            Ok(Err(e)) => return crate::store::describe(&e),
            Err(_) => return format!("no answer within {:?}", connector.per_address),
        }
    }
}

fn parse_key_id(payload: &str) -> Option<KeyId> {
    crate::key::from_hex(payload)
}
