//! How client-chosen bytes (keys, user and role names, certificate names, anything a request
//! carries) appear in log lines: `Quoted`, as Go's `%q` prints them, so that a key holding a newline
//! and a fake log line stays one field of one line.
//!
//! Every log field whose value a client chose goes through `Quoted` (`%Quoted::str(name)`,
//! `%Quoted::bytes(key)`). As a second guard the text logger (`logging/mod.rs`) escapes any line break
//! left inside an event, so that a field someone forgot to quote still cannot start a new line.

use std::fmt::{self, Write as _};

/// Bytes shown between double quotes, with `"`, `\`, control and other non-printable characters
/// escaped (`\n`, `\u{1b}`, `\u{2028}`) and bytes that are not UTF-8 as `\xNN`.
#[derive(Clone, Copy)]
pub(crate) struct Quoted<'a>(&'a [u8]);

impl<'a> Quoted<'a> {
    pub(crate) fn bytes(bytes: &'a [u8]) -> Quoted<'a> {
        Quoted(bytes)
    }

    pub(crate) fn str(text: &'a str) -> Quoted<'a> {
        Quoted(text.as_bytes())
    }
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                write_char_escaped(f, c)?;
            }
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        f.write_char('"')
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A printable character as itself; anything Rust's `escape_debug` escapes (quotes, backslash,
/// controls, line and paragraph separators, unassigned and format characters) escaped. A single
/// quote needs no escape between double quotes.
fn write_char_escaped(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    if c == '\'' {
        return f.write_char(c);
    }
    for escaped in c.escape_debug() {
        f.write_char(escaped)?;
    }
    Ok(())
}

/// `text` with every line break escaped (`\n`, `\r`, vertical tab, form feed, NEL, U+2028, U+2029):
/// the text logger's last guard, applied to a whole formatted event. Other characters are kept (the
/// terminal colours' escape sequences among them).
pub(crate) fn escape_line_breaks(text: &str) -> std::borrow::Cow<'_, str> {
    let breaks = |c: char| matches!(c, '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}');
    if !text.contains(breaks) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if breaks(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_quotes_and_bad_bytes_are_escaped_printable_text_is_kept() {
        let shown = |bytes: &[u8]| Quoted::bytes(bytes).to_string();
        assert_eq!(shown(b"/app/config"), "\"/app/config\"");
        assert_eq!(shown("clé 键 it's".as_bytes()), "\"clé 键 it's\"");
        assert_eq!(shown(b"a\nINFO forged"), "\"a\\nINFO forged\"");
        assert_eq!(shown(b"\r\t\x00\x1b[31m"), "\"\\r\\t\\0\\u{1b}[31m\"");
        assert_eq!(shown(b"say \"hi\" \\o/"), "\"say \\\"hi\\\" \\\\o/\"");
        assert_eq!(shown(b"\xff\xfe ok \xc3"), "\"\\xff\\xfe ok \\xc3\"");
        assert_eq!(shown("a\u{2028}b\u{85}c\u{202e}".as_bytes()), "\"a\\u{2028}b\\u{85}c\\u{202e}\"");
        assert_eq!(Quoted::str("alice").to_string(), "\"alice\"");
    }

    #[test]
    fn a_quoted_value_never_holds_a_line_break() {
        for byte in 0..=255u8 {
            let text = Quoted::bytes(&[b'x', byte, b'y']).to_string();
            assert!(!text.contains(['\n', '\r', '\u{0b}', '\u{0c}']), "{byte:#x}: {text}");
        }
    }

    #[test]
    fn line_breaks_in_a_formatted_line_are_escaped() {
        assert_eq!(escape_line_breaks("plain line"), "plain line");
        assert_eq!(escape_line_breaks("a\nb\r\nc\u{2028}d"), "a\\nb\\r\\nc\\u{2028}d");
    }
}
