//! `POST /admin/rekey`: the rekey pass run inside the serving proxy — the way to rekey an
//! embedded store, whose file the serving process holds locked (PostgreSQL can also be
//! rekeyed from outside, `idemproxy rekey`). Same pass, same compare-and-set.

use http::{Response, StatusCode};

use super::error::AdminError;
use super::{json, store_failed};
use crate::background::rekey::{self, DEFAULT_BATCH};
use crate::body::ProxyBody;
use crate::proxy::Proxy;
use crate::store::{KeyStore, Reseal};

pub(super) async fn request<S: KeyStore + Reseal>(proxy: &Proxy<S>) -> Response<ProxyBody> {
    let Some(vault) = proxy.vault() else {
        return AdminError::EncryptionOff("There is no key to seal stored answers with: configure `encryption.keys` and `encryption.active`, then restart.".into()).into_response();
    };
    match rekey::once(proxy.store(), vault, DEFAULT_BATCH).await {
        Ok(report) => {
            tracing::warn!(summary = %report.summary(), "rekey by an operator");
            json(StatusCode::OK, &report)
        }
        Err(e) => store_failed(&e),
    }
}
