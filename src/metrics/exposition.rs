//! The text a scrape reads: OpenMetrics for those who ask for it, the classic format
//! otherwise.

use super::Metrics;

impl Metrics {
    /// The classic Prometheus text format (0.0.4), for readers that do not ask for
    /// OpenMetrics: a counter's `HELP` and `TYPE` name its `_total` series, and there is
    /// no `# EOF`.
    pub fn render_classic(&self) -> String {
        let open = self.render();
        let mut out = String::with_capacity(open.len());
        let mut help: Option<&str> = None;
        for line in open.lines() {
            if line.starts_with("# HELP ") {
                help = Some(line);
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if kind == "counter" && !name.ends_with("_total") {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                if let Some(help) = help.take() {
                    let text = help
                        .strip_prefix("# HELP ")
                        .and_then(|h| h.split_once(' '))
                        .map_or("", |(_, text)| text);
                    out.push_str(&format!("# HELP {name} {text}\n"));
                }
                out.push_str(&format!("# TYPE {name} {kind}\n"));
                continue;
            }
            if line == "# EOF" || line.starts_with("# UNIT ") {
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// The exposition text (OpenMetrics).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
