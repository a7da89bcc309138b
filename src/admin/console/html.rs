//! The console's HTML: escaping, the page frame every page shares (navigation, the
//! logout form, a skip link for keyboard users), and how times and durations read.

use std::fmt::Write;

/// Text made safe for HTML content and attribute values.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query parameter's value, percent-encoded.
pub(super) fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The link to one key's story.
pub(super) fn key_link(client: &str, key: &str) -> String {
    format!(
        "/console/key?client={}&key={}",
        query_value(client),
        query_value(key)
    )
}

/// Who is logged in and their form token, for the frame's logout form and the pages'
/// forms.
pub(super) struct Viewer<'a> {
    pub who: &'a str,
    pub csrf: &'a str,
}

impl Viewer<'_> {
    /// The hidden field every form of the session posts back.
    pub fn csrf_field(&self) -> String {
        format!(
            "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
            esc(self.csrf)
        )
    }
}

/// Which page of the navigation is open.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    Overview,
    Unresolved,
    Key,
    None,
}

/// A whole page: `title`, the navigation (when logged in) and `main`.
pub(super) fn page(title: &str, viewer: Option<&Viewer<'_>>, tab: Tab, main: &str) -> String {
    let mut out = String::with_capacity(main.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · idemproxy console</title>\
         <link rel=\"stylesheet\" href=\"/console/console.css\">\
         <script src=\"/console/console.js\" defer></script></head><body>\
         <a class=\"skip\" href=\"#main\">Skip to content</a><header><span class=\"brand\">idemproxy</span>",
        esc(title)
    );
    if let Some(v) = viewer {
        let link = |t: Tab, href: &str, label: &str| {
            let current = if t == tab {
                " aria-current=\"page\""
            } else {
                ""
            };
            format!("<a href=\"{href}\"{current}>{label}</a>")
        };
        let _ = write!(
            out,
            "<nav aria-label=\"Console\">{}{}{}</nav>\
             <form class=\"logout\" method=\"post\" action=\"/console/logout\">{}\
             <span>Signed in as <strong>{}</strong></span> <button type=\"submit\">Log out</button></form>",
            link(Tab::Overview, "/", "Overview"),
            link(Tab::Unresolved, "/console/unresolved", "Unresolved keys"),
            link(Tab::Key, "/console/key", "Look up a key"),
            v.csrf_field(),
            esc(v.who)
        );
    }
    let _ = writeln!(
        out,
        "</header><main id=\"main\" tabindex=\"-1\"><h1>{}</h1>{main}</main></body></html>",
        esc(title)
    );
    out
}

/// A duration in words an operator reads at a glance: `42 s`, `3 min 5 s`, `2 h 10 min`,
/// `3 d 4 h`.
pub(super) fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 if ms < 1000 => format!("{} ms", ms.max(0)),
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A moment as RFC 3339 UTC, in a `<time>` element.
pub(super) fn when(ms: i64) -> String {
    let at = crate::admin::view::rfc3339(ms);
    format!("<time datetime=\"{at}\">{}</time>", at.replace('T', " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_spans_read() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(span(250), "250 ms");
        assert_eq!(span(42_000), "42 s");
        assert_eq!(span(185_000), "3 min 5 s");
        assert_eq!(span(7_800_000), "2 h 10 min");
        assert_eq!(span(273_600_000), "3 d 4 h");
        assert_eq!(key_link("a b", "k&1"), "/console/key?client=a+b&key=k%261");
    }
}
