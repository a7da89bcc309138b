//! Rekeying: every stored answer not sealed with the active key — sealed under an older
//! key, or stored in clear before encryption was turned on — is opened and sealed again
//! with the active key, so that the older key can then be removed from the ring.
//!
//! Safe while replicas serve and from several places at once: rows are read a page at a
//! time and each is replaced by a compare-and-set (see [`crate::store::Reseal`]); a row
//! another rekey got to first, or one evicted or swept meanwhile, is left as it now is. A
//! retry replaying a row during its rekey gets the old or the new sealed answer, both of
//! which open while both keys are in the ring.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::store::{Fenced, Reseal, StoreError};
use crate::vault::Vault;

/// What one rekey pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The key rows are now sealed with.
    pub active: String,
    /// Rows sealed again with the active key (clear rows included).
    pub resealed: u64,
    /// Rows that had changed when they were to be replaced (another rekey, an eviction,
    /// the sweep): left as they are.
    pub changed_meanwhile: u64,
    /// Rows that could not be opened, by the key they name (`clear` never appears: a clear
    /// row always opens). They stay as they are and replay as a `500` problem until they
    /// expire, or the key is put back.
    pub unreadable: BTreeMap<String, u64>,
}

impl Report {
    /// One line for an operator.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "resealed {} stored answers with key `{}`",
            self.resealed, self.active
        );
        if self.changed_meanwhile > 0 {
            line.push_str(&format!(
                "; {} changed meanwhile (resealed elsewhere, evicted or swept) and were left",
                self.changed_meanwhile
            ));
        }
        for (key, n) in &self.unreadable {
            line.push_str(&format!(
                "; {n} could not be opened with key `{key}` (not in encryption.keys, or tampered) and were left"
            ));
        }
        line
    }
}

/// Rows read per page.
pub const DEFAULT_BATCH: i64 = 500;

/// One pass over the whole table, `batch` rows at a time.
pub async fn once<S: Reseal>(store: &S, vault: &Vault, batch: i64) -> Result<Report, StoreError> {
    let mut report = Report {
        active: vault.active().to_owned(),
        ..Report::default()
    };
    let mut after: Option<(String, String)> = None;
    loop {
        let cursor = after.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
        let page = store
            .not_sealed_with(vault.active(), cursor, batch.max(1))
            .await?;
        let full = page.len() as i64 >= batch.max(1);
        for row in &page {
            let opened = Vault::open(Some(vault), &row.client_id, &row.key, row.answer.clone());
            let clear = match opened {
                Ok(clear) => clear,
                Err(why) => {
                    tracing::warn!(
                        key = %crate::key::key_hash(&row.client_id, &row.key),
                        encryption_key = why.ring_key(),
                        reason = why.reason(),
                        "rekey: a stored answer cannot be opened; left as it is"
                    );
                    *report
                        .unreadable
                        .entry(why.ring_key().to_owned())
                        .or_default() += 1;
                    continue;
                }
            };
            let sealed = vault.seal(&row.client_id, &row.key, row.token, &clear);
            match store.reseal(row, &sealed).await? {
                Fenced::Applied => report.resealed += 1,
                Fenced::Refused => report.changed_meanwhile += 1,
            }
        }
        match page.last() {
            Some(last) if full => after = Some((last.client_id.clone(), last.key.clone())),
            _ => {
                if report.resealed > 0 {
                    store.forget_replaced().await?;
                }
                return Ok(report);
            }
        }
    }
}
