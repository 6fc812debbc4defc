//! The page shell (navigation, who is logged in, the flash line) and the
//! formatting every page shares: times, ages, counts, rates, bodies.

use axum::http::StatusCode;
use maud::{DOCTYPE, Markup, html};

use super::{Flash, Session};

/// A whole page: title, navigation, the flash line if any, the body.
pub(crate) fn page(title: &str, s: &Session, flash: Option<&Flash>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top {
                    a.brand href="/" { "letterbox" }
                    nav {
                        a href="/" { "Queues" }
                        a href="/exchanges" { "Exchanges" }
                        a href="/definitions" { "Definitions" }
                    }
                    span.who {
                        @if s.logged_in {
                            (s.principal.name())
                            form.inline method="post" action="/logout" {
                                (csrf(s))
                                button #logout .link type="submit" { "log out" }
                            }
                        } @else {
                            "authentication off (loopback only)"
                        }
                    }
                }
                main {
                    @if let Some(f) = flash {
                        p #flash .flash.(if f.ok { "ok" } else { "error" }) role="status" { (f.text) }
                    }
                    (body)
                }
            }
        }
    }
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            // htmx must not add an inline <style> (the CSP forbids it).
            meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false}"#;
            title { (title) " · letterbox" }
            link rel="stylesheet" href="/assets/app.css";
            link rel="stylesheet" href="/assets/uPlot.min.css";
            script src="/assets/htmx.min.js" defer {}
            script src="/assets/uPlot.iife.min.js" defer {}
            script src="/assets/app.js" defer {}
        }
    }
}

/// A page without navigation (login, errors before a session).
pub(crate) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top { a.brand href="/" { "letterbox" } }
                main { (body) }
            }
        }
    }
}

/// The page of a refused or failed request.
pub(crate) fn error_page(status: StatusCode, text: &str) -> Markup {
    bare(
        status.canonical_reason().unwrap_or("Error"),
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p #flash .flash.error role="alert" { (text) }
            p { a href="/" { "Back to the queues" } }
        },
    )
}

/// The hidden CSRF field every form carries.
pub(crate) fn csrf(s: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(s.csrf()); }
}

/// A unix time in ms as `YYYY-MM-DD HH:MM:SSZ`; empty for 0.
pub(crate) fn time(ms: u64) -> String {
    if ms == 0 {
        return String::new();
    }
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(String::new, |t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
}

/// A duration in ms, short: `850ms`, `12s`, `3m 12s`, `5h 02m`, `2d 3h`.
pub(crate) fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 if ms == 0 => "0".into(),
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A rate per second, short.
pub(crate) fn rate(r: f64) -> String {
    if r == 0.0 {
        "0".into()
    } else if r < 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.0}")
    }
}

/// Bytes, in binary units.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// How to show a message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyView {
    Text,
    Json,
    Hex,
}

impl BodyView {
    pub(crate) fn parse(s: Option<&str>) -> Option<BodyView> {
        match s? {
            "text" => Some(BodyView::Text),
            "json" => Some(BodyView::Json),
            "hex" => Some(BodyView::Hex),
            _ => None,
        }
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            BodyView::Text => "text",
            BodyView::Json => "json",
            BodyView::Hex => "hex",
        }
    }
}

/// The view a body is best shown in: JSON when it parses, text when it is
/// UTF-8 without control characters (but line breaks and tabs), else hex.
pub(crate) fn best_view(body: &[u8]) -> BodyView {
    if serde_json::from_slice::<serde_json::Value>(body).is_ok() {
        return BodyView::Json;
    }
    match std::str::from_utf8(body) {
        Ok(t)
            if !t
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) =>
        {
            BodyView::Text
        }
        _ => BodyView::Hex,
    }
}

/// A body shown as asked, cut at `limit` bytes (the cut said).
pub(crate) fn body_text(body: &[u8], view: BodyView, limit: usize) -> String {
    let cut = &body[..body.len().min(limit)];
    let mut out = match view {
        BodyView::Json => match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) if body.len() <= limit => {
                serde_json::to_string_pretty(&v).unwrap_or_else(|_| lossy(cut))
            }
            _ => lossy(cut),
        },
        BodyView::Text => lossy(cut),
        BodyView::Hex => hex_dump(cut),
    };
    if body.len() > limit {
        out.push_str(&format!("\n… ({} of {} bytes shown)", limit, body.len()));
    }
    out
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Sixteen bytes a line: offset, hex, printable characters.
fn hex_dump(b: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in b.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|x| format!("{x:02x}")).collect();
        let text: String = chunk
            .iter()
            .map(|&x| {
                if x.is_ascii_graphic() || x == b' ' {
                    char::from(x)
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {:<47}  {text}\n", i * 16, hex.join(" ")));
    }
    out
}

/// A one-line preview of a body for tables.
pub(crate) fn preview(body: &[u8]) -> String {
    let t = match best_view(body) {
        BodyView::Hex => format!("({} bytes, binary)", body.len()),
        _ => lossy(&body[..body.len().min(120)]).replace(['\n', '\r', '\t'], " "),
    };
    if body.len() > 120 && !t.starts_with('(') {
        format!("{t}…")
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_shown_in_the_view_that_fits() {
        assert_eq!(best_view(br#"{"a":1}"#), BodyView::Json);
        assert_eq!(best_view(b"hello\nworld"), BodyView::Text);
        assert_eq!(best_view(&[0, 159, 146, 150]), BodyView::Hex);
        assert_eq!(
            body_text(br#"{"a":1}"#, BodyView::Json, 100),
            "{\n  \"a\": 1\n}"
        );
        assert!(body_text(b"abc", BodyView::Hex, 100).starts_with("00000000  61 62 63"));
        assert!(body_text(b"abcdef", BodyView::Text, 3).contains("3 of 6 bytes shown"));
    }

    #[test]
    fn figures_read_short() {
        assert_eq!(age(0), "0");
        assert_eq!(age(850), "850ms");
        assert_eq!(age(192_000), "3m 12s");
        assert_eq!(age(5 * 3_600_000 + 120_000), "5h 02m");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(2.25), "2.2");
        assert_eq!(time(1), "1970-01-01 00:00:00Z");
    }
}
