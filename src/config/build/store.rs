//! `store:` — which backend keeps the keys, and its settings.

use std::path::PathBuf;

use super::Problems;
use crate::config::file::FileConfig;
use crate::config::model::*;

pub(super) fn build_store(p: &mut Problems, file: &FileConfig) -> Option<StoreConfig> {
    let store = file.store.as_ref();
    match (
        store.and_then(|s| s.postgres.as_ref()),
        store.and_then(|s| s.embedded.as_ref()),
    ) {
        (Some(_), Some(_)) => {
            p.push(
                "store",
                "configure either `postgres` or `embedded`, not both",
            );
            None
        }
        (Some(pg), None) => {
            let Some(url) = pg.url.clone() else {
                p.push(
                    "store.postgres.url",
                    "required (or set DATABASE_URL / --database-url)",
                );
                return None;
            };
            if let Err(e) = url.parse::<tokio_postgres::Config>() {
                p.push("store.postgres.url", format!("not a PostgreSQL URL: {e}"));
                return None;
            }
            let pool_size = pg.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
            if pool_size == 0 {
                p.push("store.postgres.pool_size", "must be at least 1");
            }
            let timeout = pg.timeout.map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
            if timeout.is_zero() {
                p.push("store.postgres.timeout", "must be more than 0s");
            }
            Some(StoreConfig::Postgres(PostgresConfig {
                url,
                pool_size,
                connect_timeout: pg.connect_timeout.map_or(DEFAULT_CONNECT_TIMEOUT, |d| d.0),
                timeout,
            }))
        }
        (None, embedded) => {
            let timeout = embedded
                .and_then(|e| e.timeout)
                .map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
            if timeout.is_zero() {
                p.push("store.embedded.timeout", "must be more than 0s");
            }
            Some(StoreConfig::Embedded {
                path: PathBuf::from(
                    embedded
                        .and_then(|e| e.path.clone())
                        .unwrap_or_else(|| DEFAULT_EMBEDDED_PATH.into()),
                ),
                timeout,
            })
        }
    }
}
