//! [`SseEvents`]: a server-sent event stream cut into whole events, each
//! handed to an [`EventEditor`] once.

use bytes::{BufMut, Bytes, BytesMut};

use super::sse::{SseLines, SsePiece, line_content};

const BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// One event of a stream, as an [`EventEditor`] sees it.
#[derive(Debug)]
pub(crate) struct Event<'a> {
    /// The event's lines, their endings included, without the blank line
    /// that ended it.
    pub(crate) lines: &'a [u8],
    /// Its `data`.
    pub(crate) data: EventData<'a>,
}

/// The `data` of an event.
#[derive(Debug)]
pub(crate) enum EventData<'a> {
    /// No `data` line.
    None,
    /// One `data` line: the usual chunk.
    One(DataLine<'a>),
    /// Several: their values, in order (the event's data is their values
    /// joined by `\n`).
    Many(Vec<DataLine<'a>>),
}

/// A `data` line of an event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataLine<'a> {
    /// Where the line starts in [`Event::lines`].
    pub(crate) start: usize,
    /// The whole line, its ending included.
    pub(crate) line: &'a [u8],
    /// Its value: after `data:` and one space, without the line ending.
    pub(crate) value: &'a [u8],
}

impl DataLine<'_> {
    /// The event's lines with this line's value replaced by `value`.
    pub(crate) fn replaced_in(&self, lines: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::with_capacity(lines.len() + value.len());
        self.write_replaced(lines, &mut out, |out| out.put_slice(value));
        out.to_vec()
    }

    /// Writes the event's `lines` to `out` with this line's value as
    /// `write_value` writes it.
    pub(crate) fn write_replaced(
        &self,
        lines: &[u8],
        out: &mut BytesMut,
        write_value: impl FnOnce(&mut BytesMut),
    ) {
        out.reserve(lines.len() + 64);
        let value_start = self.value.as_ptr() as usize - self.line.as_ptr() as usize;
        let value_end = value_start + self.value.len();
        out.put_slice(&lines[..self.start + value_start]);
        write_value(out);
        out.put_slice(&lines[self.start + value_end..]);
    }
}

/// What becomes of an event.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// It passes as it came.
    Keep,
    /// It is dropped whole, its blank line too.
    Drop,
    /// The editor wrote the lines that go in its place to the output it
    /// was given (its blank line follows).
    Written,
}

/// Reads, and may change, each event of a stream.
pub(crate) trait EventEditor {
    /// What becomes of `event`; an editor that rewrites it may write the
    /// new lines to `out` itself ([`Verdict::Written`]).
    fn event(&mut self, event: &Event<'_>, out: &mut BytesMut) -> Verdict;

    /// A piece of an event too long to hold, passing as it is: the editor
    /// may count what it carries.
    fn long_piece(&mut self, _piece: &[u8]) {}
}

/// Cuts an event stream into events however its chunks fall and hands
/// each, whole, to an [`EventEditor`] once, holding at most the bound it
/// is made with of an event.
///
/// Editing ([`SseEvents::editing`]), an event is held until its blank line
/// (a client acts on nothing sooner) and what the editor says goes out; a
/// comment between events passes at once, so keep-alives still keep the
/// connection alive. Reading only ([`SseEvents::reading`]), the caller
/// passes the bytes on as they come and nothing is written out. Either
/// way, an event longer than the bound passes unread (the editor is shown
/// its pieces: [`EventEditor::long_piece`]), and lines end at `\n`,
/// `\r\n` or a lone `\r`.
#[derive(Debug)]
pub(crate) struct SseEvents {
    lines: SseLines,
    // The lines of the event being read, up to its blank line.
    event: BytesMut,
    // The event had a line too long to hold: it passes as it is.
    passing_event: bool,
    // A line has been read: a byte-order mark can only open the first.
    started: bool,
    // The event being read opened the stream (its first line may start
    // with a byte-order mark).
    event_opens_stream: bool,
    editing: bool,
    max_event_bytes: usize,
    // What became of the last line: where the `\n` of its `\r\n`, cut
    // off by the chunk's end, goes.
    last_line: LineFate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineFate {
    Held,
    Written,
    Dropped,
}

impl SseEvents {
    /// Events of at most `max_event_bytes` the editor may change, drop or
    /// keep.
    pub(crate) fn editing(max_event_bytes: usize) -> Self {
        SseEvents::new(true, max_event_bytes)
    }

    /// Events of at most `max_event_bytes` the editor reads only; its
    /// verdicts are not asked for.
    pub(crate) fn reading(max_event_bytes: usize) -> Self {
        SseEvents::new(false, max_event_bytes)
    }

    fn new(editing: bool, max_event_bytes: usize) -> Self {
        SseEvents {
            max_event_bytes,
            lines: SseLines::with_max(max_event_bytes),
            event: BytesMut::new(),
            passing_event: false,
            started: false,
            event_opens_stream: false,
            editing,
            last_line: LineFate::Written,
        }
    }

    /// Whether an event too long to hold is passing.
    pub(crate) fn is_passing(&self) -> bool {
        self.passing_event
    }

    /// Whether events are held and edited.
    pub(crate) fn is_editing(&self) -> bool {
        self.editing
    }

    /// Reads the next bytes of the stream; what may go on is added to
    /// `out` (editing only).
    pub(crate) fn feed(&mut self, data: &[u8], editor: &mut impl EventEditor, out: &mut BytesMut) {
        if self.editing {
            // About what goes out: grown once, not event by event.
            out.reserve(data.len() + self.event.len());
        }
        self.lines.push(data);
        while let Some(piece) = self.lines.next_piece() {
            self.piece(piece, editor, out);
        }
    }

    /// At the stream's end: the last line, and an event that was not ended
    /// by a blank line, read all the same.
    pub(crate) fn finish(&mut self, editor: &mut impl EventEditor, out: &mut BytesMut) {
        if let Some(piece) = self.lines.finish() {
            self.piece(piece, editor, out);
        }
        if !self.event.is_empty() {
            self.end_event(b"", editor, out);
        }
        self.passing_event = false;
    }

    /// Whether nothing is held: the bytes so far end between two events.
    pub(crate) fn between_events(&self) -> bool {
        self.lines.is_empty()
            && self.event.is_empty()
            && !self.passing_event
            && !self.lines.after_cr()
    }

    fn write(&self, out: &mut BytesMut, bytes: &[u8]) {
        if self.editing {
            out.extend_from_slice(bytes);
        }
    }

    fn piece(&mut self, piece: SsePiece, editor: &mut impl EventEditor, out: &mut BytesMut) {
        match piece {
            SsePiece::Long(part) => {
                let held = self.event.split();
                editor.long_piece(&held);
                editor.long_piece(&part);
                self.write(out, &held);
                self.write(out, &part);
                self.passing_event = true;
                self.last_line = LineFate::Written;
            }
            SsePiece::Line(line) => self.line(line, editor, out),
            SsePiece::LineEnd(end) => match self.last_line {
                LineFate::Held => self.event.extend_from_slice(&end),
                LineFate::Written => self.write(out, &end),
                LineFate::Dropped => {}
            },
        }
        self.started = true;
    }

    fn line(&mut self, line: Bytes, editor: &mut impl EventEditor, out: &mut BytesMut) {
        let blank = line_content(&line).is_empty();
        self.last_line = LineFate::Written;
        if self.passing_event {
            editor.long_piece(&line);
            self.write(out, &line);
            self.passing_event = !blank;
        } else if blank {
            self.end_event(&line, editor, out);
        } else if self.event.is_empty() && line.starts_with(b":") {
            self.write(out, &line);
        } else {
            if self.event.is_empty() {
                self.event_opens_stream = !self.started;
            }
            self.event.extend_from_slice(&line);
            self.last_line = LineFate::Held;
            if self.event.len() > self.max_event_bytes {
                let held = self.event.split();
                editor.long_piece(&held);
                self.write(out, &held);
                self.passing_event = true;
                self.last_line = LineFate::Written;
            }
        }
    }

    fn end_event(&mut self, blank: &[u8], editor: &mut impl EventEditor, out: &mut BytesMut) {
        let lines = self.event.split().freeze();
        let event = Event {
            data: data_of(&lines, self.event_opens_stream),
            lines: &lines,
        };
        if !self.editing {
            editor.event(&event, &mut BytesMut::new());
            return;
        }
        match editor.event(&event, out) {
            Verdict::Written => {}
            Verdict::Keep => out.extend_from_slice(&lines),
            Verdict::Drop => {
                self.last_line = LineFate::Dropped;
                return;
            }
        }
        out.extend_from_slice(blank);
    }
}

/// The `data` lines of an event's `lines`.
fn data_of(lines: &[u8], opens_stream: bool) -> EventData<'_> {
    let mut found = EventData::None;
    let mut start = 0;
    let mut rest = lines;
    while !rest.is_empty() {
        let end = line_end(rest);
        let line = &rest[..end];
        let mut field = line_content(line);
        if start == 0 && opens_stream {
            field = field.strip_prefix(BYTE_ORDER_MARK).unwrap_or(field);
        }
        let value = match field.strip_prefix(b"data") {
            Some(b"") => Some(&field[field.len()..]),
            Some(value) => value
                .strip_prefix(b":")
                .map(|value| value.strip_prefix(b" ").unwrap_or(value)),
            None => None,
        };
        if let Some(value) = value {
            let data = DataLine { start, line, value };
            found = match found {
                EventData::None => EventData::One(data),
                EventData::One(first) => EventData::Many(vec![first, data]),
                EventData::Many(mut all) => {
                    all.push(data);
                    EventData::Many(all)
                }
            };
        }
        start += end;
        rest = &rest[end..];
    }
    found
}

/// The length of the first line of `bytes`, its ending included.
fn line_end(bytes: &[u8]) -> usize {
    match memchr::memchr2(b'\n', b'\r', bytes) {
        Some(at) if bytes[at] == b'\r' && bytes.get(at + 1) == Some(&b'\n') => at + 2,
        Some(at) => at + 1,
        None => bytes.len(),
    }
}
