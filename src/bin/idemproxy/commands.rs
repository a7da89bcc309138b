//! The one-shot commands' plumbing: migrations, the health probe, writing output.

use anyhow::{Context, bail};
use idemproxy::config::StoreConfig;
use idemproxy::store::PgStore;

pub async fn probe(url: &str) -> anyhow::Result<()> {
    use http_body_util::Empty;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("`{url}` is not a URL"))?;
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), client.get(uri))
        .await
        .context("timed out")?
        .with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    Ok(())
}

pub fn postgres_store(store: &StoreConfig) -> anyhow::Result<PgStore> {
    match store {
        StoreConfig::Postgres(pg) => Ok(PgStore::new(pg)?),
        StoreConfig::Embedded { .. } => {
            bail!(
                "no PostgreSQL URL configured: set store.postgres.url, DATABASE_URL or --database-url"
            )
        }
    }
}

/// Writes a command's output. A reader that went away (`check-config | head -1`) is not
/// an error: what it wanted, it got.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// Applies the migrations the database lacks (the library says which it applied).
pub async fn apply_migrations(store: &PgStore) -> anyhow::Result<()> {
    idemproxy::app::apply_migrations(store)
        .await
        .context("applying migrations")?;
    Ok(())
}
