//! `migrations/schema.sql` — the schema as the numbered migrations leave it, written in one
//! place so that a reader finds the current functions without walking the history — is that
//! schema: built from the file and from the migrations, the two agree on every table,
//! column, constraint, index, sequence and function.

use crate::support::TestDb;

/// Everything a schema is made of, one line each, sorted, with the schema's own name
/// taken out. The migrations' bookkeeping table is not part of the schema a reader wants.
pub(crate) async fn shape(db: &TestDb) -> Vec<String> {
    const PARTS: [&str; 6] = [
        "SELECT format('table %s (%s)', c.relname, coalesce(array_to_string(c.reloptions, ','), '')) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relkind = 'r'",
        "SELECT format('column %s.%s %s collate=%s null=%s default=%s', table_name, column_name, \
                       data_type, coalesce(collation_name, '-'), is_nullable, \
                       coalesce(column_default, '-')) \
         FROM information_schema.columns WHERE table_schema = $1",
        "SELECT format('constraint %s %s', c.conrelid::regclass, pg_get_constraintdef(c.oid)) \
         FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1",
        "SELECT format('index %s', indexdef) FROM pg_indexes WHERE schemaname = $1",
        "SELECT format('sequence %s', sequence_name) FROM information_schema.sequences \
         WHERE sequence_schema = $1",
        "SELECT format('function %s', pg_get_functiondef(p.oid)) \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
    ];
    let client = db.client().await;
    let mut lines = Vec::new();
    for part in PARTS {
        for row in client.query(part, &[&db.schema]).await.unwrap() {
            let line: String = row.get(0);
            if !line.contains("idemproxy_migrations") {
                lines.push(line.replace(&db.schema, "SCHEMA"));
            }
        }
    }
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_file_matches_the_migrations() {
    let migrated = TestDb::new().await;
    let from_file = TestDb::empty().await;
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/schema.sql"),
    )
    .unwrap();
    from_file.client().await.batch_execute(&text).await.unwrap();

    let (want, got) = (shape(&migrated).await, shape(&from_file).await);
    assert!(
        want.iter().any(|l| l.starts_with("function")) && want.len() > 20,
        "the comparison sees the schema: {want:#?}"
    );
    let missing: Vec<_> = want.iter().filter(|l| !got.contains(l)).collect();
    let extra: Vec<_> = got.iter().filter(|l| !want.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "migrations/schema.sql differs from what the migrations make.\nonly from the migrations:\n{missing:#?}\nonly from schema.sql:\n{extra:#?}"
    );
}
