//! Whose namespace a request's key lives in: the client identity, from the configured
//! source (a gateway's header, a credential's hash or its tenant, a verified JWT's claim,
//! one fixed name). Two tenants that both send `order-1` must never share an answer; one
//! tenant's renewed token or rotated API key must not split its keys.

use http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::config::ClientIdSource;
use crate::key::{MAX_CLIENT_ID_LEN, hex, is_visible_ascii};
use crate::problem::ProxyError;

/// Finds the client identity from the configured trusted source.
pub fn client_id(headers: &HeaderMap, source: &ClientIdSource) -> Result<String, ProxyError> {
    match source {
        ClientIdSource::Static(name) => Ok(name.clone()),
        ClientIdSource::AuthorizationSha256 => {
            let mut values = headers.get_all(header::AUTHORIZATION).iter();
            let (Some(value), None) = (values.next(), values.next()) else {
                return Err(ProxyError::MissingClientId {
                    what: "exactly one `Authorization` header is required".into(),
                    unauthorized: true,
                });
            };
            let digest = Sha256::digest(value.as_bytes());
            Ok(hex(&digest))
        }
        ClientIdSource::Credentials(creds) => {
            let mut values = headers.get_all(&creds.header).iter();
            let name = &creds.header;
            let (Some(value), None) = (values.next(), values.next()) else {
                return Err(ProxyError::MissingClientId {
                    what: format!("exactly one `{name}` header is required"),
                    unauthorized: true,
                });
            };
            let digest: [u8; 32] = Sha256::digest(value.as_bytes()).into();
            match creds.tenants.get(&digest) {
                Some(tenant) => Ok(tenant.clone()),
                // The namespace `authorization: sha256` gives it: moving from there to a
                // list splits no key in flight.
                None if creds.unlisted_own_namespace => Ok(hex(&digest)),
                None => Err(ProxyError::MissingClientId {
                    what: format!(
                        "the credential in `{name}` is not one that client_id.credentials names a tenant for"
                    ),
                    unauthorized: true,
                }),
            }
        }
        ClientIdSource::Jwt(jwt) => {
            let refused = |what: String| ProxyError::MissingClientId {
                what,
                unauthorized: true,
            };
            let mut values = headers.get_all(header::AUTHORIZATION).iter();
            let (Some(value), None) = (values.next(), values.next()) else {
                return Err(refused(
                    "exactly one `Authorization: Bearer <JWT>` header is required".into(),
                ));
            };
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim())
                .ok_or_else(|| refused("`Authorization` is not `Bearer <JWT>`".into()))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            jwt.verifier.identity(token, now).map_err(refused)
        }
        ClientIdSource::Header(name) => {
            let mut values = headers.get_all(name).iter();
            let Some(value) = values.next() else {
                return Err(ProxyError::MissingClientId {
                    what: format!("the `{name}` header is missing"),
                    unauthorized: false,
                });
            };
            if values.next().is_some() {
                return Err(ProxyError::InvalidClientId {
                    reason: format!("`{name}` was sent more than once"),
                });
            }
            let id = std::str::from_utf8(value.as_bytes())
                .ok()
                .map(|s| s.trim_matches(' '))
                .filter(|s| is_visible_ascii(s))
                .ok_or_else(|| ProxyError::InvalidClientId {
                    reason: format!("`{name}` contains control or non-ASCII characters"),
                })?;
            if id.is_empty() || id.len() > MAX_CLIENT_ID_LEN {
                return Err(ProxyError::InvalidClientId {
                    reason: format!("`{name}` must be 1 to {MAX_CLIENT_ID_LEN} characters"),
                });
            }
            Ok(id.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};
    use std::sync::Arc;

    /// Each source yields the right identity or the right error status.
    #[test]
    fn client_ids() {
        let mut h = HeaderMap::new();
        let src = ClientIdSource::Header(HeaderName::from_static("x-client-id"));
        assert_eq!(client_id(&h, &src).unwrap_err().status(), 400);
        assert_eq!(
            client_id(&h, &ClientIdSource::AuthorizationSha256)
                .unwrap_err()
                .status(),
            401
        );
        h.insert("x-client-id", HeaderValue::from_static("shop-1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert_eq!(client_id(&h, &src).unwrap(), "shop-1");
        let a = client_id(&h, &ClientIdSource::AuthorizationSha256).unwrap();
        assert_eq!(a.len(), 64);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k2"));
        assert_ne!(
            client_id(&h, &ClientIdSource::AuthorizationSha256).unwrap(),
            a
        );
    }

    /// Two credentials named for one tenant are one namespace; an unlisted one is a `401`,
    /// or its own namespace when asked, never a tenant's.
    #[test]
    fn credentials_name_a_tenant() {
        use crate::config::Credentials;
        let hash = |v: &str| -> [u8; 32] { Sha256::digest(v.as_bytes()).into() };
        let mut creds = Credentials {
            header: HeaderName::from_static("x-api-key"),
            tenants: [
                (hash("key-old"), "shop-1".to_owned()),
                (hash("key-new"), "shop-1".to_owned()),
                (hash("key-other"), "shop-2".to_owned()),
            ]
            .into(),
            unlisted_own_namespace: false,
        };
        let with = |creds: &Credentials, value: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = value {
                h.insert("x-api-key", HeaderValue::from_static(v));
            }
            client_id(&h, &ClientIdSource::Credentials(Arc::new(creds.clone())))
        };
        assert_eq!(with(&creds, Some("key-old")).unwrap(), "shop-1");
        assert_eq!(with(&creds, Some("key-new")).unwrap(), "shop-1");
        assert_eq!(with(&creds, Some("key-other")).unwrap(), "shop-2");
        assert_eq!(with(&creds, Some("key-stolen")).unwrap_err().status(), 401);
        assert_eq!(with(&creds, None).unwrap_err().status(), 401);
        creds.unlisted_own_namespace = true;
        let own = with(&creds, Some("key-stolen")).unwrap();
        assert_eq!(own, hex(&hash("key-stolen")));
    }
}
