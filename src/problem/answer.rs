//! A [`ProxyError`] as the answer a client gets: in the route's error dialect
//! ([`crate::dialect`]), with the headers every dialect shares.

use bytes::Bytes;
use http::{HeaderValue, Response, header};

use super::{ProxyError, TYPE_PREFIX};
use crate::body::{ProxyBody, full};
use crate::dialect::{Dialect, Rendered, Said};

impl ProxyError {
    /// The full response, with `Retry-After` where a retry will help.
    pub fn into_response(self) -> Response<ProxyBody> {
        self.into_response_in(&Dialect::default())
    }

    /// The status and body of this answer in `dialect` (for `check-config`).
    pub fn render_in(&self, dialect: &Dialect) -> (u16, Vec<u8>) {
        let rendered = self.rendered(dialect);
        (rendered.status.as_u16(), rendered.body)
    }

    /// This answer in `dialect`: status, content type, body, retry hint.
    pub(crate) fn rendered(&self, dialect: &Dialect) -> Rendered {
        let (status, slug, title, detail) = self.entry();
        let kind = format!("{TYPE_PREFIX}{slug}");
        dialect.render(&Said {
            status,
            kind: &kind,
            code: slug,
            category: "",
            title,
            detail: &detail,
            retry_after: self.retry_after(),
            retry_helps: self.retry_helps(),
        })
    }

    /// The answer in a route's dialect ([`crate::dialect`]): the same status (but where
    /// the dialect's clients need another), `Retry-After` and `Cache-Control` in all.
    pub fn into_response_in(self, dialect: &Dialect) -> Response<ProxyBody> {
        let retry_after = self.retry_after();
        let rendered = self.rendered(dialect);
        let mut resp = Response::new(full(Bytes::from(rendered.body)));
        *resp.status_mut() = rendered.status;
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, rendered.content_type);
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        for (name, value) in rendered.headers {
            headers.insert(name, value);
        }
        if let Some(retry) = rendered.should_retry {
            headers.insert(
                STRIPE_SHOULD_RETRY,
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        resp
    }
}

/// Stripe's hint to its SDKs on whether a retry can help.
const STRIPE_SHOULD_RETRY: http::HeaderName = http::HeaderName::from_static("stripe-should-retry");
