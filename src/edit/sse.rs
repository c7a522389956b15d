//! [`SseLines`]: a server-sent event stream cut into lines.

use bytes::{Bytes, BytesMut};

/// Longest SSE line held while waiting for its end; a longer one passes on
/// unchanged.
pub const MAX_SSE_LINE_BYTES: usize = 1024 * 1024;

/// A piece of a server-sent event stream, as [`SseLines`] cuts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SsePiece {
    /// One whole line, its line ending (`\n`, `\r\n` or `\r`) included
    /// (none on a body's last line when the body ends without one).
    Line(Bytes),
    /// Part of a line longer than the bound, to pass on as it
    /// is; the piece that holds the line's end ends with its line ending.
    Long(Bytes),
    /// The `\n` of a `\r\n` whose `\r` ended the last chunk (and so the
    /// line before, at once): it belongs to that line.
    LineEnd(Bytes),
}

/// Cuts an event stream into lines however its chunks fall, holding at
/// most [`MAX_SSE_LINE_BYTES`] of a line while waiting for its end
/// (or the bound [`SseLines::with_max`] sets).
#[derive(Debug)]
pub(crate) struct SseLines {
    max_line_bytes: usize,
    held: BytesMut,
    // How far `held` is known to have no `\n`: a line that arrives byte
    // by byte is not searched again from its start each time.
    scanned: usize,
    in_long_line: bool,
    // The last line ended with a `\r` that ended what was held: a `\n`
    // next belongs to it.
    after_cr: bool,
}

impl Default for SseLines {
    fn default() -> Self {
        SseLines::with_max(MAX_SSE_LINE_BYTES)
    }
}

impl SseLines {
    /// Lines held up to `max_line_bytes` while waiting for their end.
    pub(crate) fn with_max(max_line_bytes: usize) -> Self {
        SseLines {
            max_line_bytes,
            held: BytesMut::new(),
            scanned: 0,
            in_long_line: false,
            after_cr: false,
        }
    }

    /// Adds the next bytes of the stream; take the pieces out with
    /// [`SseLines::next_piece`] before the next push.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.held.extend_from_slice(data);
    }

    /// The next piece the bytes pushed so far complete.
    pub(crate) fn next_piece(&mut self) -> Option<SsePiece> {
        if self.held.is_empty() {
            return None;
        }
        if std::mem::take(&mut self.after_cr) && self.held[0] == b'\n' {
            return Some(SsePiece::LineEnd(self.held.split_to(1).freeze()));
        }
        let unscanned = self.held.get(self.scanned..).unwrap_or_default();
        // A line ends at `\n`, `\r\n` or a lone `\r`; a `\r` that ends
        // what is held ends its line at once (a client would act on it),
        // and a `\n` that comes next is told apart.
        let end = match memchr::memchr2(b'\n', b'\r', unscanned) {
            Some(at) if unscanned[at] == b'\n' => Some(at + 1),
            Some(at) => match unscanned.get(at + 1) {
                Some(b'\n') => Some(at + 2),
                Some(_) => Some(at + 1),
                None => {
                    self.after_cr = true;
                    Some(at + 1)
                }
            },
            None => None,
        };
        match end {
            Some(end) => {
                let line = self.held.split_to(self.scanned + end).freeze();
                self.scanned = 0;
                if std::mem::take(&mut self.in_long_line) {
                    Some(SsePiece::Long(line))
                } else {
                    Some(SsePiece::Line(line))
                }
            }
            None if self.in_long_line || self.held.len() > self.max_line_bytes => {
                self.in_long_line = true;
                self.scanned = 0;
                Some(SsePiece::Long(self.held.split().freeze()))
            }
            None => {
                self.scanned = self.held.len();
                None
            }
        }
    }

    /// At the body's end: what is left, a last line without its ending.
    pub(crate) fn finish(&mut self) -> Option<SsePiece> {
        self.after_cr = false;
        if self.held.is_empty() {
            return None;
        }
        self.scanned = 0;
        let rest = self.held.split().freeze();
        if std::mem::take(&mut self.in_long_line) {
            Some(SsePiece::Long(rest))
        } else {
            Some(SsePiece::Line(rest))
        }
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether the last line ended with a `\r` that may yet be followed
    /// by its `\n`.
    pub(crate) fn after_cr(&self) -> bool {
        self.after_cr
    }
}

/// A line without its ending (`\n` or `\r\n`; a lone `\r` too, as the
/// event stream format allows).
pub(crate) fn line_content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines_pass_an_over_long_line_in_pieces_and_then_cut_lines_again() {
        let mut lines = SseLines::default();
        let long = vec![b'x'; MAX_SSE_LINE_BYTES + 1];
        lines.push(b"a\r\n");
        lines.push(&long[..10]);
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"a\r\n")))
        );
        assert_eq!(lines.next_piece(), None, "a partial line waits");
        lines.push(&long[10..]);
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Long(Bytes::from(long.clone())))
        );
        lines.push(b"yy\nb\n");
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Long(Bytes::from_static(b"yy\n")))
        );
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"b\n")))
        );
        assert_eq!(lines.next_piece(), None);
        lines.push(b"end");
        assert_eq!(lines.next_piece(), None);
        assert_eq!(
            lines.finish(),
            Some(SsePiece::Line(Bytes::from_static(b"end")))
        );
        assert!(lines.is_empty());
        assert_eq!(lines.finish(), None);
    }

    #[test]
    fn a_lone_carriage_return_ends_a_line_and_a_late_line_feed_is_told_apart() {
        let mut lines = SseLines::default();
        lines.push(b"a\rb\r");
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"a\r")))
        );
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"b\r")))
        );
        assert!(lines.after_cr());
        lines.push(b"\n\nc\r");
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::LineEnd(Bytes::from_static(b"\n")))
        );
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"\n"))),
            "a blank line"
        );
        assert_eq!(
            lines.next_piece(),
            Some(SsePiece::Line(Bytes::from_static(b"c\r")))
        );
        lines.push(b"d");
        assert_eq!(lines.next_piece(), None);
        assert!(!lines.after_cr(), "not followed by `\\n`");
        assert_eq!(
            lines.finish(),
            Some(SsePiece::Line(Bytes::from_static(b"d")))
        );
    }

    #[test]
    fn a_line_loses_its_ending_and_nothing_else() {
        assert_eq!(line_content(b"data: x\r\n"), b"data: x");
        assert_eq!(line_content(b"data: x\n"), b"data: x");
        assert_eq!(line_content(b"data: x\r"), b"data: x");
        assert_eq!(line_content(b"data: x"), b"data: x");
        assert_eq!(line_content(b"\n"), b"");
        assert_eq!(line_content(b"a\n\n"), b"a\n", "one ending only");
    }
}
