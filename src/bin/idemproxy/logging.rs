//! Logging to stderr, as text for people or as one JSON object per line for log
//! pipelines. In JSON every field sits at the top level — the event's and those of the
//! spans it happened in (`key`, `route` on a key's detached work) — so `jq 'select(.key ==
//! "…")'` finds a key's every line without knowing which span carried the field.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::cli::LogFormat;

pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .init(),
    }
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message`, the event's
/// fields, then the enclosing spans' fields (innermost first; an event's own field wins
/// over a span's of the same name), and `span`, the innermost span's name.
struct FlatJson;

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let meta = event.metadata();
        let mut object = Map::new();
        object.insert("timestamp".into(), Value::String(timestamp));
        object.insert("level".into(), Value::String(meta.level().as_str().into()));
        object.insert("target".into(), Value::String(meta.target().into()));
        event.record(&mut Fields(&mut object));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope {
                innermost.get_or_insert_with(|| span.name());
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    for (name, value) in fields {
                        object.entry(name).or_insert(value);
                    }
                }
            }
            if let Some(name) = innermost {
                object
                    .entry("span")
                    .or_insert_with(|| Value::String(name.into()));
            }
        }
        writeln!(writer, "{}", Value::Object(object))
    }
}

/// Records an event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::Bool(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
}

/// A fatal error, said where the operator's log pipeline looks: a JSON line when the logs
/// are JSON, a plain line otherwise.
pub fn fatal(format: LogFormat, error: &anyhow::Error) {
    match format {
        LogFormat::Text => eprintln!("idemproxy: {error:#}"),
        LogFormat::Json => tracing::error!(error = %format!("{error:#}"), "idemproxy stopped"),
    }
}
