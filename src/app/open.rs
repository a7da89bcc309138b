//! Opening the configured store for a serving process: say which it is, refuse one that
//! cannot work, and agree the form its keys are stored in — in the library, where `App`
//! and the tests can reach it, not in the binary.

use crate::config::{self, Config, StoreConfig};
use crate::proxy::Proxy;
use crate::store::{
    AnyStore, Health, KeyFormAgreement, PgStore, SettleKeyForm, StoreError, migrate,
};

/// Why a serving process cannot start on its store.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening the store")]
    Open(#[source] StoreError),
    #[error("applying migrations")]
    Migrate(#[source] StoreError),
    #[error("the store cannot be reached securely")]
    Tls(#[source] StoreError),
    #[error("the store is not ready")]
    NotReady(#[source] StoreError),
    #[error("the store answers with an error")]
    Failed(#[source] StoreError),
    #[error("asking the store which form its keys are in")]
    KeyForm(#[source] StoreError),
    #[error("{0}")]
    FormDiffers(String),
}

/// Applies the migrations `pg` lacks, saying which (`idemproxy migrate`, `serve --migrate`).
pub async fn apply_migrations(pg: &PgStore) -> Result<Vec<i32>, StoreError> {
    let mut client = pg.client().await?;
    let applied = migrate(&mut client).await?;
    if applied.is_empty() {
        tracing::info!("database schema is up to date");
    } else {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(applied)
}

/// Opens the configured store for this process, says which it is, and refuses to start
/// on one that cannot work: an embedded file another process holds, a PostgreSQL schema
/// that is missing or older than this binary (unless `--migrate`), a database that
/// answers with errors, keys stored in another form than this configuration's
/// (`encryption.hash_keys`). A database that cannot be reached yet is only a warning:
/// protected requests get `503` until it is back. Also says whether the key form was
/// agreed (it could not be with the store unreachable).
pub async fn open_store(
    config: &Config,
    run_migrations: bool,
) -> Result<(AnyStore, bool), OpenError> {
    let store = AnyStore::open_for_process(&config.store, true).map_err(OpenError::Open)?;
    match (&store, &config.store) {
        (AnyStore::Postgres(pg), StoreConfig::Postgres(settings)) => {
            tracing::info!(
                store = "postgres",
                target = %settings.target(),
                "using the PostgreSQL store (shared by every replica on this database)"
            );
            if run_migrations {
                apply_migrations(pg).await.map_err(OpenError::Migrate)?;
            }
        }
        (AnyStore::Embedded(embedded), _) => tracing::warn!(
            store = "embedded",
            path = %embedded.path().display(),
            "using the embedded store: for ONE proxy instance only; instances with separate files do not share keys (use PostgreSQL for replicas)"
        ),
        (AnyStore::Postgres(_), StoreConfig::Embedded { .. }) => {}
    }
    let form = config.key_form();
    let agreed = match store.ping().await {
        Ok(()) => {
            if let (AnyStore::Postgres(pg), StoreConfig::Postgres(settings)) =
                (&store, &config.store)
            {
                log_postgres_connection(config, pg, settings);
                log_server_advice(pg).await;
            }
            match store.settle_key_form(form.marker()).await {
                Ok(KeyFormAgreement::Agreed) => true,
                Ok(KeyFormAgreement::Differs { stored }) => {
                    return Err(OpenError::FormDiffers(form_differs(&stored, form.marker())));
                }
                Err(e) if e.is_unreachable() => false,
                Err(e) => return Err(OpenError::KeyForm(e)),
            }
        }
        Err(e) if e.is_tls() => return Err(OpenError::Tls(e)),
        Err(e @ StoreError::SchemaBehind { .. }) => return Err(OpenError::NotReady(e)),
        Err(e) if e.is_unreachable() => {
            tracing::warn!(cause = %e, "store unreachable at start; protected requests get 503 until it is back");
            false
        }
        Err(e) => return Err(OpenError::Failed(e)),
    };
    Ok((store, agreed))
}

/// Why a store whose keys are in `stored` cannot be served with this configuration's form.
fn form_differs(stored: &str, ours: &str) -> String {
    let describe = |marker: &str| match marker {
        "clear" => "as sent (encryption.hash_keys off)".to_owned(),
        other => format!("as keyed hashes (encryption.hash_keys: true; hash_key verifier {other})"),
    };
    format!(
        "encryption.hash_keys: the store's idempotency keys are kept {}, and this configuration would keep them {}: it would not find them, and every retry of a stored key would execute again. Configure encryption.hash_keys and encryption.hash_key as the replicas that wrote them do; the form can change only while the store holds no keys (docs/security.md)",
        describe(stored),
        describe(ours)
    )
}

/// Agrees the key form once the store answers, holding keyed requests back until then.
/// A store in another form keeps them held, said loudly: serving them would execute
/// retries again.
pub async fn agree_later(proxy: Proxy<AnyStore>) {
    let marker = proxy.key_form().marker().to_owned();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        match proxy.store().settle_key_form(&marker).await {
            Ok(KeyFormAgreement::Agreed) => {
                proxy.release_keys();
                tracing::info!("the store's key form is agreed; keyed requests are served");
                return;
            }
            Ok(KeyFormAgreement::Differs { stored }) => {
                let why = form_differs(&stored, &marker);
                tracing::error!(
                    "{why}; keyed requests are refused with 503 until the configuration is fixed"
                );
                proxy.hold_keys_until_agreed(why);
                return;
            }
            Err(_) => {}
        }
    }
}

/// What the first store connection showed: TLS, a pooler, and how waiting duplicates
/// will be woken.
fn log_postgres_connection(config: &Config, pg: &PgStore, settings: &config::PostgresConfig) {
    let pooler = pg.behind_pooler();
    tracing::info!(
        host = pg.connected_to().as_deref().unwrap_or("?"),
        tls = %settings.tls.summary(),
        encrypted = pg.tls_used(),
        transaction_pooler = pooler,
        "store connection made"
    );
    let waits = config
        .routes
        .routes()
        .iter()
        .any(|r| matches!(r.policy.on_conflict, config::OnConflict::Wait(_)));
    if !waits {
        return;
    }
    match (&settings.listen_url, pooler) {
        (Some(_), _) => {
            tracing::info!("waiting duplicates are woken by LISTEN on store.postgres.listen_url")
        }
        (None, false) => {
            tracing::info!("waiting duplicates are woken by LISTEN on the store's URL")
        }
        (None, true) => tracing::warn!(
            "the store's URL goes through a transaction pooler, which drops notifications: waiting duplicates fall back to a 1 s re-check; set store.postgres.listen_url to a direct connection"
        ),
    }
}

/// The server settings far from what the key table's churn needs (autovacuum, WAL
/// spacing, durable commits), one warning each; not a reason to refuse to start.
async fn log_server_advice(pg: &PgStore) {
    match pg.server_advice().await {
        Ok(advice) => {
            for line in &advice {
                tracing::warn!(advice = %line, "a database server setting is far off");
            }
            tracing::info!(
                far_off = advice.len(),
                "database server settings checked (docs/stores.md, \"Tuning the server\")"
            );
        }
        Err(e) => tracing::debug!(cause = %e, "could not read the database server's settings"),
    }
}
