//! `upstream:` and `tls:` — where requests go, and how TLS is set up on both sides.

use super::Problems;
use crate::config::file::FileConfig;
use crate::config::model::*;

pub(super) fn build_upstream(p: &mut Problems, file: &FileConfig) -> Option<UpstreamConfig> {
    let up = file.upstream.as_ref();
    let Some(url) = up.and_then(|u| u.url.as_deref()) else {
        p.push(
            "upstream.url",
            "required (or pass --upstream http://host:port)",
        );
        return None;
    };
    let uri: http::Uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => {
            p.push("upstream.url", format!("`{url}` is not a URL: {e}"));
            return None;
        }
    };
    let scheme = match uri.scheme_str() {
        Some("http") => "http",
        Some("https") => "https",
        _ => {
            p.push(
                "upstream.url",
                format!("`{url}` must start with http:// or https://"),
            );
            return None;
        }
    };
    let Some(authority) = uri.authority().cloned() else {
        p.push("upstream.url", format!("`{url}` has no host"));
        return None;
    };
    if uri.query().is_some() {
        p.push("upstream.url", "must not carry a query string");
        return None;
    }
    let origin = http::Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query("/")
        .build()
        .ok()?;
    let connect_timeout = up
        .and_then(|u| u.connect_timeout)
        .map_or(DEFAULT_CONNECT_TIMEOUT, |d| d.0);
    let timeout = up
        .and_then(|u| u.timeout)
        .map_or(DEFAULT_UPSTREAM_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        p.push("upstream.timeout", "must be more than 0s");
    }
    let max_connections = up
        .and_then(|u| u.max_connections)
        .unwrap_or(DEFAULT_UPSTREAM_MAX_CONNECTIONS);
    if max_connections == 0 {
        p.push("upstream.max_connections", "must be at least 1");
    }
    let (tls, tls_summary) = build_upstream_tls(p, up.and_then(|u| u.tls.as_ref()))?;
    Some(UpstreamConfig {
        tls,
        tls_summary,
        max_connections,
        origin,
        base_path: uri.path().trim_end_matches('/').to_owned(),
        connect_timeout,
        timeout,
    })
}

fn build_upstream_tls(
    p: &mut Problems,
    file: Option<&crate::config::file::FileUpstreamTls>,
) -> Option<(std::sync::Arc<rustls::ClientConfig>, String)> {
    let roots = match file.and_then(|t| t.roots.as_deref()) {
        None | Some("webpki") => crate::tls::Roots::Webpki,
        Some("system") => crate::tls::Roots::System,
        Some(other) => {
            p.push(
                "upstream.tls.roots",
                format!("`{other}`: use `webpki` or `system`"),
            );
            return None;
        }
    };
    let ca = file
        .and_then(|t| t.ca_file.as_deref())
        .map(std::path::Path::new);
    let client = match (
        file.and_then(|t| t.client_cert.as_deref()),
        file.and_then(|t| t.client_key.as_deref()),
    ) {
        (Some(cert), Some(key)) => Some((std::path::Path::new(cert), std::path::Path::new(key))),
        (None, None) => None,
        _ => {
            p.push(
                "upstream.tls",
                "set both `client_cert` and `client_key`, or neither",
            );
            return None;
        }
    };
    match crate::tls::client_config(roots, ca, client) {
        Ok(config) => {
            // A YAML flow mapping, so that the printed configuration reads back.
            let path = |p: &std::path::Path| {
                serde_json::to_string(&p.display().to_string()).unwrap_or_default()
            };
            let summary = format!(
                "{{ roots: {}{}{} }}",
                if roots == crate::tls::Roots::Webpki {
                    "webpki"
                } else {
                    "system"
                },
                ca.map(|c| format!(", ca_file: {}", path(c)))
                    .unwrap_or_default(),
                client
                    .map(|(c, k)| format!(", client_cert: {}, client_key: {}", path(c), path(k)))
                    .unwrap_or_default()
            );
            Some((config, summary))
        }
        Err(e) => {
            p.push("upstream.tls", e);
            None
        }
    }
}

pub(super) fn build_listener_tls(
    p: &mut Problems,
    file: Option<&crate::config::file::FileListenerTls>,
) -> Option<std::sync::Arc<rustls::ServerConfig>> {
    let file = file?;
    let (Some(cert), Some(key)) = (file.cert_file.as_deref(), file.key_file.as_deref()) else {
        p.push("tls", "set both `cert_file` and `key_file`");
        return None;
    };
    match crate::tls::server_config(std::path::Path::new(cert), std::path::Path::new(key)) {
        Ok(config) => Some(config),
        Err(e) => {
            p.push("tls", e);
            None
        }
    }
}
