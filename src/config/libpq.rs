//! The TLS parameters of a libpq connection string (`sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`), taken out before the rest goes to tokio-postgres.
//!
//! Users write these in the URLs they already have (a managed database's connection
//! string says `sslmode=verify-full&sslrootcert=...`), but tokio-postgres knows only
//! `disable`/`prefer`/`require` and none of the file parameters, and would refuse the URL.
//! So they are split off here, the connection is made with rustls (see
//! `crate::store::PgStore`), and the URL handed on is the rest, unchanged.

/// The TLS parameters found in a connection string, as written.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
}

impl TlsParams {
    fn slot(&mut self, key: &str) -> Option<&mut Option<String>> {
        match key {
            "sslmode" => Some(&mut self.sslmode),
            "sslrootcert" => Some(&mut self.sslrootcert),
            "sslcert" => Some(&mut self.sslcert),
            "sslkey" => Some(&mut self.sslkey),
            _ => None,
        }
    }
}

/// Splits `conn` (a `postgres://` URL or a `key=value` string) into the string without its
/// TLS parameters and those parameters.
pub fn split_tls(conn: &str) -> Result<(String, TlsParams), String> {
    if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        Ok(split_url(conn))
    } else {
        split_key_values(conn)
    }
}

fn split_url(url: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), params);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(raw_key);
        match params.slot(&key) {
            Some(slot) => *slot = Some(decode(raw_value)),
            None => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, params)
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// `host=db port=5432 sslmode='verify-full'`: whitespace-separated `key=value` pairs, a
/// value optionally single-quoted with `\` escapes, as libpq reads them.
fn split_key_values(conn: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams::default();
    let mut kept = Vec::new();
    let mut chars = conn.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut key = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        if chars.next().map(|(_, c)| c) != Some('=') {
            return Err(format!("`{key}` has no `=value`"));
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek().is_some_and(|&(_, c)| c == '\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(format!("the value of `{key}` has no closing quote")),
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("the value of `{key}` ends in `\\`")),
                    },
                    Some((_, c)) => value.push(c),
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        let end = chars.peek().map_or(conn.len(), |&(i, _)| i);
        match params.slot(&key) {
            Some(slot) => *slot = Some(value),
            None => kept.push(&conn[start..end]),
        }
    }
    Ok((kept.join(" "), params))
}

/// One connection string per host of a multi-host `conn` (`postgres://u@h1:5432,h2:5433/db`
/// or `host=h1,h2 port=5432,5433`), each naming that host alone and keeping everything
/// else. A single-host string comes back as it is.
///
/// Why: tokio-postgres tries a multi-host string's hosts in a fixed order, and bounds only
/// each TCP connect; a host that accepts the connection but never answers would hold every
/// attempt on the first host. One string per host lets the store bound each host's whole
/// attempt, and try first the host that answered last.
pub fn split_hosts(conn: &str) -> Vec<String> {
    if let Some(scheme_end) = conn
        .strip_prefix("postgres://")
        .map(|_| "postgres://".len())
        .or_else(|| {
            conn.strip_prefix("postgresql://")
                .map(|_| "postgresql://".len())
        })
    {
        let rest = &conn[scheme_end..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let hosts = split_outside_brackets(hosts);
        if hosts.len() <= 1 {
            return vec![conn.to_owned()];
        }
        return hosts
            .iter()
            .map(|host| {
                format!(
                    "{}{userinfo}{host}{}",
                    &conn[..scheme_end],
                    &rest[authority_end..]
                )
            })
            .collect();
    }
    let pairs: Vec<&str> = conn.split_whitespace().collect();
    let value = |key: &str| {
        pairs
            .iter()
            .find_map(|p| p.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    let Some(hosts) = value("host") else {
        return vec![conn.to_owned()];
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.len() <= 1 {
        return vec![conn.to_owned()];
    }
    let ports: Vec<&str> = value("port")
        .map(|p| p.split(',').collect())
        .unwrap_or_default();
    hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let mut out: Vec<String> = pairs
                .iter()
                .filter(|p| !p.starts_with("host=") && !p.starts_with("port="))
                .map(|p| (*p).to_owned())
                .collect();
            out.push(format!("host={host}"));
            if let Some(port) = ports.get(i).or(ports.first()) {
                out.push(format!("port={port}"));
            }
            out.join(" ")
        })
        .collect()
}

fn split_outside_brackets(hosts: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in hosts.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&hosts[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !hosts.is_empty() {
        out.push(&hosts[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TLS parameters leave a URL; everything else stays as written.
    #[test]
    fn urls() {
        let (rest, p) = split_tls(
            "postgres://u:p@db.example:5432/pay?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p@db.example:5432/pay?application_name=x&target_session_attrs=read-write"
        );
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let (rest, p) = split_tls("postgresql://h/db?sslmode=require").unwrap();
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(p.sslmode.as_deref(), Some("require"));
        let (rest, p) = split_tls("postgres://h/db").unwrap();
        assert_eq!(
            (rest.as_str(), p),
            ("postgres://h/db", TlsParams::default())
        );
    }

    /// A multi-host string becomes one string per host, the rest kept.
    #[test]
    fn hosts() {
        assert_eq!(
            split_hosts(
                "postgres://u:p@db1:5432,[::1]:5433,db3/pay?target_session_attrs=read-write"
            ),
            [
                "postgres://u:p@db1:5432/pay?target_session_attrs=read-write",
                "postgres://u:p@[::1]:5433/pay?target_session_attrs=read-write",
                "postgres://u:p@db3/pay?target_session_attrs=read-write",
            ]
        );
        assert_eq!(split_hosts("postgres://db/pay"), ["postgres://db/pay"]);
        assert_eq!(
            split_hosts("host=a,b port=1,2 dbname=pay"),
            ["dbname=pay host=a port=1", "dbname=pay host=b port=2"]
        );
        assert_eq!(split_hosts("host=a dbname=pay"), ["host=a dbname=pay"]);
    }

    /// The key=value form, quoted values included.
    #[test]
    fn key_values() {
        let (rest, p) = split_tls(
            "host=db port=5432 sslmode = 'verify-ca' sslcert='/c d/cert.pem' user=pay sslkey=/k.pem",
        )
        .unwrap();
        assert_eq!(rest, "host=db port=5432 user=pay");
        assert_eq!(p.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(p.sslcert.as_deref(), Some("/c d/cert.pem"));
        assert_eq!(p.sslkey.as_deref(), Some("/k.pem"));
        assert!(split_tls("host=db sslmode='x").is_err());
        assert!(split_tls("host").is_err());
    }
}
