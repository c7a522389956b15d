//! [`JsonObject`]: a JSON object edited at its top level only.

/// A JSON object edited at its top level only: the members it leaves
/// alone, and the bytes between them, are copied from the text as they
/// were, so a message's or a completion's text is never rebuilt.
#[derive(Debug)]
pub(crate) struct JsonObject<'a> {
    text: &'a [u8],
    members: Vec<Member<'a>>,
    // Where a member goes in an object that has none: just after `{`.
    open_end: usize,
    added: Vec<(String, String)>,
}

#[derive(Debug)]
struct Member<'a> {
    name: std::borrow::Cow<'a, str>,
    key_start: usize,
    value: &'a str,
    value_end: usize,
    edit: Option<MemberEdit>,
}

#[derive(Debug)]
enum MemberEdit {
    Replace(String),
    Remove,
}

#[cfg(test)]
thread_local! {
    /// How many times this thread has parsed an object: what shows a
    /// reader parses each chunk once.
    pub(crate) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// How many times this thread's parses went on from a memo.
    static RESUMES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A top-level name that appears more than once: which one an edit means
/// is unclear (and the next reader may take the other), so it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeated;

impl<'a> JsonObject<'a> {
    /// `text` read as one JSON object (whitespace around it allowed);
    /// `None` when it is anything else.
    pub(crate) fn parse(text: &'a [u8]) -> Option<JsonObject<'a>> {
        JsonObject::parse_counting_text(text, &mut 0)
    }

    /// [`JsonObject::parse`], adding to `text_bytes` the bytes of the
    /// strings that a member named `content`, `reasoning` or `arguments`
    /// holds at any depth (escapes counted as written): the text a
    /// streamed chunk carries.
    pub(crate) fn parse_counting_text(
        text: &'a [u8],
        text_bytes: &mut u64,
    ) -> Option<JsonObject<'a>> {
        JsonObject::parse_after(text, text_bytes, None)
    }

    /// [`JsonObject::parse_counting_text`] for one object of a stream:
    /// `memo` holds what the scan of the stream's previous object learnt,
    /// and the members this one repeats byte for byte from its start are
    /// taken from it instead of read again (a chunk's `id`, `object`,
    /// `created` and `model` are its previous chunk's). The result is the
    /// plain parse's; `memo` then holds this object's scan (of an object up
    /// to 16 KiB, its first 32 members: a stream's memo stays small).
    pub(crate) fn parse_after(
        text: &'a [u8],
        text_bytes: &mut u64,
        mut memo: Option<&mut ScanMemo>,
    ) -> Option<JsonObject<'a>> {
        #[cfg(test)]
        PARSES.with(|parses| parses.set(parses.get() + 1));
        // A long chunk is not kept: a stream's memo stays small.
        if text.len() > ScanMemo::MAX_TEXT_BYTES
            && let Some(memo) = memo.take()
        {
            memo.forget();
        }
        let parsed = JsonObject::scan(text, memo.as_deref_mut());
        if let Some(memo) = memo {
            match &parsed {
                Some(scanned) => {
                    memo.open_end = scanned.object.open_end;
                    memo.text.clear();
                    memo.text.extend_from_slice(text);
                }
                None => memo.forget(),
            }
        }
        let scanned = parsed?;
        *text_bytes += scanned.text_bytes;
        Some(scanned.object)
    }

    /// The scan itself: the object and the text bytes it counted. With
    /// `memo`, the members it shares with the previous object are taken
    /// from there, and every member's span is written back to it (the
    /// caller keeps the text).
    fn scan(text: &'a [u8], mut memo: Option<&mut ScanMemo>) -> Option<Scanned<'a>> {
        // Valid JSON is UTF-8 throughout, so every slice taken below is text.
        let source = std::str::from_utf8(text).ok()?;
        let mut scan = Scan {
            bytes: text,
            at: 0,
            text_bytes: 0,
            text_key: false,
        };
        // One allocation for the usual object: a chunk has about six members.
        let mut members = Vec::with_capacity(8);
        let shared = memo.as_deref().map_or(0, |memo| memo.shared_members(text));
        let open_end = match (shared, memo.as_deref_mut()) {
            // The scan's state at a member's key depends on the bytes
            // before it alone, and those are the previous object's: it
            // goes on from there as it would have.
            (1.., Some(memo)) => {
                #[cfg(test)]
                RESUMES.with(|resumes| resumes.set(resumes.get() + 1));
                for span in &memo.members[..shared] {
                    members.push(span.member(source)?);
                }
                scan.text_bytes = memo.members[shared - 1].text_bytes_through;
                scan.at = memo.members[shared].key_start;
                memo.members.truncate(shared);
                memo.open_end
            }
            _ => {
                if let Some(memo) = memo.as_deref_mut() {
                    memo.members.clear();
                }
                scan.whitespace();
                if scan.peek()? != b'{' {
                    return None;
                }
                scan.at += 1;
                let open_end = scan.at;
                scan.whitespace();
                if scan.peek()? == b'}' {
                    scan.at += 1;
                    return scan.end(JsonObject::new(text, members, open_end));
                }
                open_end
            }
        };
        loop {
            scan.whitespace();
            let key_start = scan.at;
            let escaped = scan.string()?;
            let key = &source[key_start..scan.at];
            scan.text_key = is_text_key(key.as_bytes());
            scan.whitespace();
            scan.expect(b':')?;
            scan.whitespace();
            let value_start = scan.at;
            scan.value()?;
            let value_end = scan.at;
            let quoted = &key[1..key.len() - 1];
            let name = match escaped {
                true => std::borrow::Cow::Owned(serde_json::from_str::<String>(key).ok()?),
                false => std::borrow::Cow::Borrowed(quoted),
            };
            let member = Member {
                name,
                key_start,
                value: &source[value_start..value_end],
                value_end,
                edit: None,
            };
            if let Some(memo) = memo.as_deref_mut()
                && memo.members.len() < ScanMemo::MAX_MEMBERS
            {
                memo.members.push(MemberSpan::of(&member, scan.text_bytes));
            }
            members.push(member);
            scan.whitespace();
            match scan.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
        scan.end(JsonObject::new(text, members, open_end))
    }

    fn new(text: &'a [u8], members: Vec<Member<'a>>, open_end: usize) -> JsonObject<'a> {
        JsonObject {
            text,
            members,
            open_end,
            added: Vec::new(),
        }
    }

    fn find(&self, name: &str) -> Result<Option<usize>, Repeated> {
        let mut found = None;
        for (index, member) in self.members.iter().enumerate() {
            if member.name == name {
                if found.is_some() {
                    return Err(Repeated);
                }
                found = Some(index);
            }
        }
        Ok(found)
    }

    /// The JSON text of member `name` as the object was read (edits not
    /// applied); `None` when it has no such member.
    pub(crate) fn get(&self, name: &str) -> Result<Option<&'a str>, Repeated> {
        Ok(self.find(name)?.map(|index| self.members[index].value))
    }

    /// Sets member `name` to `json` (JSON text, which the caller vouches
    /// for): in its place when the object has it, else last.
    pub(crate) fn set(&mut self, name: &str, json: String) -> Result<(), Repeated> {
        match self.find(name)? {
            Some(index) => self.members[index].edit = Some(MemberEdit::Replace(json)),
            None => match self.added.iter_mut().find(|(added, _)| added == name) {
                Some(added) => added.1 = json,
                None => self.added.push((name.to_owned(), json)),
            },
        }
        Ok(())
    }

    /// Removes member `name`, when the object has it.
    pub(crate) fn remove(&mut self, name: &str) -> Result<(), Repeated> {
        if let Some(index) = self.find(name)? {
            self.members[index].edit = Some(MemberEdit::Remove);
        }
        self.added.retain(|(added, _)| added != name);
        Ok(())
    }

    /// The object's text with the edits made.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let extra: usize = self
            .added
            .iter()
            .map(|(name, json)| name.len() + json.len() + 8)
            .sum();
        let mut out = Vec::with_capacity(self.text.len() + extra);
        self.write_to(&mut out);
        out
    }

    /// Writes the object's text with the edits made to `out`. The bytes an
    /// edit leaves alone go in as few slices as they lie in: the members
    /// around one removed or replaced are copied together.
    pub(crate) fn write_to(&self, out: &mut impl bytes::BufMut) {
        let text = self.text;
        // Up to the first member (or the `{` of an empty object), and from
        // the end of the last one: `}` and any whitespace, as they were.
        let (head_end, tail_start) = match (self.members.first(), self.members.last()) {
            (Some(first), Some(last)) => (first.key_start, last.value_end),
            _ => (self.open_end, self.open_end),
        };
        let mut copied = Runs {
            text,
            run: Some(0..head_end),
        };
        let mut wrote_any = false;
        let mut previous_end = head_end;
        for member in &self.members {
            // A kept member keeps the separator (comma and whitespace) that
            // stood before it, unless everything before it was removed.
            let start = match wrote_any {
                true => previous_end,
                false => member.key_start,
            };
            previous_end = member.value_end;
            match &member.edit {
                Some(MemberEdit::Remove) => continue,
                Some(MemberEdit::Replace(json)) => {
                    let value_start = member.value_end - member.value.len();
                    copied.copy(out, start..value_start);
                    copied.flush(out);
                    out.put_slice(json.as_bytes());
                }
                None => copied.copy(out, start..member.value_end),
            }
            wrote_any = true;
        }
        if !self.added.is_empty() {
            copied.flush(out);
        }
        for (name, json) in &self.added {
            if wrote_any {
                out.put_u8(b',');
            }
            // A `String` always serialises.
            out.put_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
            out.put_u8(b':');
            out.put_slice(json.as_bytes());
            wrote_any = true;
        }
        copied.copy(out, tail_start..text.len());
        copied.flush(out);
    }
}

/// Ranges of a text to copy, joined while each starts where the one
/// before ended: one `put_slice` per run instead of one per piece.
struct Runs<'a> {
    text: &'a [u8],
    run: Option<std::ops::Range<usize>>,
}

impl Runs<'_> {
    fn copy(&mut self, out: &mut impl bytes::BufMut, range: std::ops::Range<usize>) {
        match &mut self.run {
            Some(run) if run.end == range.start => run.end = range.end,
            _ => {
                self.flush(out);
                self.run = Some(range);
            }
        }
    }

    fn flush(&mut self, out: &mut impl bytes::BufMut) {
        if let Some(run) = self.run.take() {
            out.put_slice(&self.text[run]);
        }
    }
}

/// A strict JSON reader that checks values without building them, as
/// serde_json checks a value it skips: every object, array, string,
/// escape, number and literal as RFC 8259 spells it, at any depth.
struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
    // The bytes of the strings text members hold.
    text_bytes: u64,
    // The member whose value comes next is a text member.
    text_key: bool,
}

/// The bytes that end a string's plain run: its closing quote, an escape,
/// and the control characters that must be escaped.
static STRING_STOPS: [bool; 256] = {
    let mut stops = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        stops[byte] = true;
        byte += 1;
    }
    stops[b'"' as usize] = true;
    stops[b'\\' as usize] = true;
    stops
};

/// How many bytes of a string the table reads before the rest of its run
/// is searched for instead.
const LONG_STRING_BYTES: usize = 32;

/// The members whose strings are a chunk's text.
fn is_text_key(quoted: &[u8]) -> bool {
    // Chat's delta fields, and Anthropic's (`text_delta`, `thinking_delta`,
    // `input_json_delta`).
    matches!(
        quoted,
        b"\"content\""
            | b"\"reasoning\""
            | b"\"arguments\""
            | b"\"text\""
            | b"\"thinking\""
            | b"\"partial_json\""
    )
}

/// A scanned object and the text bytes its scan counted.
struct Scanned<'a> {
    object: JsonObject<'a>,
    text_bytes: u64,
}

/// What the scan of a stream's last object learnt, for the next one
/// ([`JsonObject::parse_after`]): its text, and where each of its members
/// lies with the text bytes counted up to its end.
#[derive(Debug, Default)]
pub(crate) struct ScanMemo {
    text: Vec<u8>,
    open_end: usize,
    members: Vec<MemberSpan>,
}

/// Where a member lies in its object's text.
#[derive(Debug)]
struct MemberSpan {
    key_start: usize,
    // The name as read when its key has an escape; else the key's text.
    unescaped: Option<String>,
    name_len: usize,
    value_len: usize,
    value_end: usize,
    // The text bytes the scan had counted at the member's end.
    text_bytes_through: u64,
}

impl MemberSpan {
    fn of(member: &Member<'_>, text_bytes_through: u64) -> MemberSpan {
        MemberSpan {
            key_start: member.key_start,
            unescaped: match &member.name {
                std::borrow::Cow::Owned(name) => Some(name.clone()),
                std::borrow::Cow::Borrowed(_) => None,
            },
            name_len: member.name.len(),
            value_len: member.value.len(),
            value_end: member.value_end,
            text_bytes_through,
        }
    }

    /// The member at this span of `source` (the same bytes as the text it
    /// was taken from, up to its end).
    fn member<'a>(&self, source: &'a str) -> Option<Member<'a>> {
        let name = match &self.unescaped {
            Some(name) => std::borrow::Cow::Owned(name.clone()),
            None => {
                let start = self.key_start + 1;
                std::borrow::Cow::Borrowed(source.get(start..start + self.name_len)?)
            }
        };
        Some(Member {
            name,
            key_start: self.key_start,
            value: source.get(self.value_end - self.value_len..self.value_end)?,
            value_end: self.value_end,
            edit: None,
        })
    }
}

impl ScanMemo {
    /// The longest object kept: a chunk is a few hundred bytes.
    const MAX_TEXT_BYTES: usize = 16 * 1024;
    /// The most members whose spans are kept: a chunk has about six.
    const MAX_MEMBERS: usize = 32;

    /// How many leading members `text` shares with the last object: those
    /// before a member whose key starts where every byte before it is the
    /// same in both. Never all of them: the scan goes on from the next key.
    fn shared_members(&self, text: &[u8]) -> usize {
        let (mut shared, mut compared_to) = (0, 0);
        for (index, span) in self.members.iter().enumerate().skip(1) {
            let range = compared_to..span.key_start;
            // `get`: a shorter text shares nothing past its end.
            if text.get(range.clone()) != self.text.get(range) {
                break;
            }
            (shared, compared_to) = (index, span.key_start);
        }
        shared
    }

    /// Nothing to go on from: the last data was no object.
    pub(crate) fn forget(&mut self) {
        self.text.clear();
        self.members.clear();
    }
}

impl Scan<'_> {
    /// The object once its closing brace is read: nothing but whitespace
    /// may follow.
    fn end<'a>(&mut self, object: JsonObject<'a>) -> Option<Scanned<'a>> {
        self.whitespace();
        if self.at != self.bytes.len() {
            return None;
        }
        Some(Scanned {
            object,
            text_bytes: self.text_bytes,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// Digits, and how many.
    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.bytes.get(self.at) {
            self.at += 1;
        }
        self.at - start
    }

    /// A string, from its opening quote; whether it has an escape.
    fn string(&mut self) -> Option<bool> {
        self.expect(b'"')?;
        let bytes = self.bytes;
        let mut at = self.at;
        let mut escaped = false;
        loop {
            // Most bytes are plain: passed over by a table, four at a time
            // while none of the four stops the run, then one by one. A
            // string that runs on past LONG_STRING_BYTES (a message's text)
            // is passed over by memchr to its next quote or backslash, the
            // bytes before it checked for a control character in one pass
            // a compiler can vectorise.
            let run_start = at;
            while let Some(four) = bytes.get(at..at + 4) {
                let stops = four
                    .iter()
                    .fold(false, |stop, &byte| stop | STRING_STOPS[usize::from(byte)]);
                if stops {
                    break;
                }
                at += 4;
                if at - run_start >= LONG_STRING_BYTES {
                    let rest = &bytes[at..];
                    let run = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
                    if rest[..run]
                        .iter()
                        .fold(false, |control, &byte| control | (byte < 0x20))
                    {
                        return None;
                    }
                    at += run;
                    break;
                }
            }
            while at < bytes.len() && !STRING_STOPS[usize::from(bytes[at])] {
                at += 1;
            }
            match *bytes.get(at)? {
                b'"' => {
                    self.at = at + 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match *bytes.get(at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                        b'u' => {
                            let hex = bytes.get(at + 2..at + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            at += 6;
                        }
                        _ => return None,
                    }
                }
                // A control character must be escaped.
                _ => return None,
            }
        }
    }

    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            // One leading zero only.
            b'0' if matches!(self.peek(), Some(b'0'..=b'9')) => return None,
            b'0' => {}
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// An object's member name and its colon.
    fn key(&mut self) -> Option<()> {
        let start = self.at;
        self.string()?;
        self.text_key = is_text_key(&self.bytes[start..self.at]);
        self.whitespace();
        self.expect(b':')
    }

    /// One value, however deep, without recursion: `closers` holds what
    /// each open object or array waits for (the first 64 as bits, `true`
    /// for an object, without an allocation).
    fn value(&mut self) -> Option<()> {
        let mut closers = Closers::default();
        loop {
            self.whitespace();
            let text_key = std::mem::take(&mut self.text_key);
            match self.peek()? {
                open @ (b'{' | b'[') => {
                    self.at += 1;
                    self.whitespace();
                    let object = open == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.peek()? != close {
                        closers.push(object);
                        if object {
                            self.key()?;
                        }
                        continue;
                    }
                    self.at += 1;
                }
                b'"' => {
                    let start = self.at;
                    self.string()?;
                    if text_key {
                        self.text_bytes += (self.at - start - 2) as u64;
                    }
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            // After a value: close what it ends, or go on to the next one.
            loop {
                let Some(object) = closers.last() else {
                    return Some(());
                };
                self.whitespace();
                match self.next()? {
                    b',' => {
                        if object {
                            self.whitespace();
                            self.key()?;
                        }
                        break;
                    }
                    b'}' if object => closers.pop(),
                    b']' if !object => closers.pop(),
                    _ => return None,
                }
            }
        }
    }
}

/// The open objects (`true`) and arrays of a value being read.
#[derive(Default)]
struct Closers {
    // The innermost 64, as bits; deeper ones spill into `deeper`.
    bits: u64,
    depth: usize,
    deeper: Vec<bool>,
}

impl Closers {
    fn push(&mut self, object: bool) {
        if self.depth >= 64 {
            self.deeper.push(self.bits >> 63 == 1);
        }
        self.bits = (self.bits << 1) | u64::from(object);
        self.depth += 1;
    }

    fn last(&self) -> Option<bool> {
        (self.depth > 0).then_some(self.bits & 1 == 1)
    }

    fn pop(&mut self) {
        self.depth -= 1;
        self.bits >>= 1;
        if self.depth >= 64 {
            let spilled = self.deeper.pop().unwrap_or(false);
            self.bits |= u64::from(spilled) << 63;
        }
    }
}

/// What a parse gives: each member's name, place and value, where an
/// added member goes, and the text it counted.
#[cfg(any(test, fuzzing))]
type Shape = (Vec<(String, usize, String, usize)>, usize, u64);

/// The parse of `text` as [`Shape`], with `memo` or without.
#[cfg(any(test, fuzzing))]
fn shape_of(text: &[u8], memo: Option<&mut ScanMemo>) -> Option<Shape> {
    let mut text_bytes = 0;
    let object = JsonObject::parse_after(text, &mut text_bytes, memo)?;
    let members = object
        .members
        .iter()
        .map(|member| {
            let name = member.name.to_string();
            (
                name,
                member.key_start,
                member.value.to_owned(),
                member.value_end,
            )
        })
        .collect();
    Some((members, object.open_end, text_bytes))
}

/// The stream parse opened to the fuzz targets
/// (`fuzz/fuzz_targets/stream_chunks.rs`), built only with `--cfg
/// fuzzing`, which `cargo fuzz` sets.
#[cfg(fuzzing)]
pub mod fuzzing {
    use super::{ScanMemo, shape_of};

    /// Parses `texts` one after the other as a stream's chunks, going on
    /// from the last one's scan, and each alone: panics where they differ.
    pub fn parse_after_agrees(texts: &[Vec<u8>]) {
        let mut memo = ScanMemo::default();
        for text in texts {
            assert_eq!(
                shape_of(text, Some(&mut memo)),
                shape_of(text, None),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn edited(text: &str, edit: impl FnOnce(&mut JsonObject<'_>)) -> String {
        let mut object = JsonObject::parse(text.as_bytes()).unwrap();
        edit(&mut object);
        String::from_utf8(object.to_bytes()).unwrap()
    }

    #[test]
    fn a_json_object_edit_keeps_every_other_byte() {
        let text = " { \"a\" : 1.50 ,\n \"b\":[ 1,2 ], \"c\" :\"\\u00e9\" } \n";
        assert_eq!(edited(text, |_| {}), text);
        assert_eq!(
            edited(text, |o| o.set("b", "true".into()).unwrap()),
            " { \"a\" : 1.50 ,\n \"b\":true, \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("a").unwrap()),
            " { \"b\":[ 1,2 ], \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("b").unwrap()),
            " { \"a\" : 1.50, \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("c").unwrap()),
            " { \"a\" : 1.50 ,\n \"b\":[ 1,2 ] } \n"
        );
        assert_eq!(
            edited(text, |o| {
                o.remove("a").unwrap();
                o.remove("c").unwrap();
                o.set("d", "{}".into()).unwrap();
            }),
            " { \"b\":[ 1,2 ],\"d\":{} } \n"
        );
        assert_eq!(
            edited(text, |o| ["a", "b", "c"]
                .iter()
                .for_each(|n| o.remove(n).unwrap())),
            " {  } \n"
        );
        assert_eq!(
            edited("{}", |o| o.set("x", "1".into()).unwrap()),
            "{\"x\":1}"
        );
        assert_eq!(
            edited("{ }", |o| o.set("x", "1".into()).unwrap()),
            "{\"x\":1 }"
        );
        assert_eq!(edited("{}", |o| o.remove("x").unwrap()), "{}");
    }

    #[test]
    fn a_json_object_knows_escaped_names_and_refuses_repeated_ones() {
        let text = r#"{"\u006dodel":"a","m\"q":1}"#;
        let object = JsonObject::parse(text.as_bytes()).unwrap();
        assert_eq!(object.get("model"), Ok(Some("\"a\"")));
        assert_eq!(object.get("m\"q"), Ok(Some("1")));
        assert_eq!(object.get("other"), Ok(None));
        // The name's own bytes stay as they were spelled.
        assert_eq!(
            edited(text, |o| o.set("model", "\"b\"".into()).unwrap()),
            r#"{"\u006dodel":"b","m\"q":1}"#
        );
        let mut repeated = JsonObject::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(repeated.get("a"), Err(Repeated));
        assert_eq!(repeated.set("a", "0".into()), Err(Repeated));
        assert_eq!(repeated.remove("a"), Err(Repeated));
        assert_eq!(repeated.get("b"), Ok(Some("2")));
        for not_an_object in [&b"[1]"[..], b"", b"{", b"{\"a\":1}x", b"null", b"\"{}\""] {
            assert!(JsonObject::parse(not_an_object).is_none());
        }
    }

    /// What serde_json reads of `text` as an object's members: each name
    /// and where its key starts, and each value's text. The oracle the
    /// reader above must agree with.
    fn serde_members(text: &[u8]) -> Option<Vec<(String, usize, String)>> {
        use serde_json::value::RawValue;
        struct RawMembers<'a>(Vec<(&'a RawValue, &'a RawValue)>);
        impl<'de: 'a, 'a> serde::Deserialize<'de> for RawMembers<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
                    type Value = RawMembers<'a>;
                    fn expecting(
                        &self,
                        formatter: &mut std::fmt::Formatter<'_>,
                    ) -> std::fmt::Result {
                        formatter.write_str("a JSON object")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<RawMembers<'a>, A::Error> {
                        let mut members = Vec::new();
                        while let Some(name) = map.next_key()? {
                            members.push((name, map.next_value()?));
                        }
                        Ok(RawMembers(members))
                    }
                }
                deserializer.deserialize_map(Visitor(std::marker::PhantomData))
            }
        }
        let RawMembers(raw) = serde_json::from_slice(text).ok()?;
        raw.into_iter()
            .map(|(key, value)| {
                let name = serde_json::from_str::<String>(key.get()).ok()?;
                let start = key.get().as_ptr() as usize - text.as_ptr() as usize;
                Some((name, start, value.get().to_owned()))
            })
            .collect()
    }

    fn members(text: &[u8]) -> Option<Vec<(String, usize, String)>> {
        let object = JsonObject::parse(text)?;
        Some(
            object
                .members
                .iter()
                .map(|member| {
                    (
                        member.name.to_string(),
                        member.key_start,
                        member.value.to_owned(),
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn the_reader_refuses_what_serde_json_refuses() {
        for text in [
            &b"{\"a\":01}"[..],
            b"{\"a\":1.}",
            b"{\"a\":1e}",
            b"{\"a\":-}",
            b"{\"a\":[1,]}",
            b"{\"a\":{\"b\":1,}}",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{\"a\":tru}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\\u12g4\"}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":[}",
            b"{\"a\":{]}",
            b"{\"a\":\"\xff\"}",
            b"{\"\\ud800\":1}",
            b"{\"a\":1}}",
            b"{a:1}",
        ] {
            assert_eq!(members(text), None, "{}", String::from_utf8_lossy(text));
            assert_eq!(
                serde_members(text),
                None,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(500), "]".repeat(500));
        assert_eq!(members(deep.as_bytes()), serde_members(deep.as_bytes()));
        assert!(
            members(deep.as_bytes()).is_some(),
            "no depth limit, as serde_json skips"
        );
        let odd = br#" {"a" : -0.5e+3 , "b":[true,false,null,{"c":"\u00e9\n\/"}] ,"\u0061":{} } "#;
        assert_eq!(members(odd), serde_members(odd));
        assert!(members(odd).is_some());
    }

    /// Any JSON value, as text with its whitespace.
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            "\"([a-z \u{e9}\u{1F600}]|\\\\[nt\"/\\\\]|\\\\u00[0-9a-f]{2}){0,6}\"",
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            let spaced =
                (inner, "[ \n]{0,1}").prop_map(|(value, space)| format!("{space}{value}{space}"));
            prop_oneof![
                proptest::collection::vec(spaced.clone(), 0..4)
                    .prop_map(|values| format!("[{}]", values.join(","))),
                proptest::collection::vec(("[a-z]{0,3}", spaced), 0..4).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(name, value)| format!("\"{name}\":{value}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    proptest! {
        /// The reader reads what serde_json reads, and refuses what it
        /// refuses: valid objects, and the same with one byte broken.
        #[test]
        fn the_reader_agrees_with_serde_json(
            members_text in proptest::collection::vec(("[a-z\"\\\\]{0,3}", json_text()), 0..5),
            cut in any::<proptest::sample::Index>(),
            byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b':'), Just(b'{'), Just(b'}'), Just(b'['), Just(b']'), Just(b'0'), Just(b'e'), Just(b'.'), Just(b'-'), Just(0x01u8), Just(0xffu8), any::<u8>()],
            how in 0u8..4,
        ) {
            let members_text: Vec<String> = members_text
                .into_iter()
                .map(|(name, value)| format!("{}:{value}", serde_json::to_string(&name).unwrap()))
                .collect();
            let text = format!(" {{{}}} ", members_text.join(" , "));
            prop_assert!(members(text.as_bytes()).is_some(), "{}", text);
            prop_assert_eq!(members(text.as_bytes()), serde_members(text.as_bytes()));
            let mut broken = text.into_bytes();
            let at = cut.index(broken.len());
            match how {
                0 => broken[at] = byte,
                1 => broken.insert(at, byte),
                2 => { broken.remove(at); }
                _ => broken.truncate(at),
            }
            prop_assert_eq!(members(&broken), serde_members(&broken), "{}", String::from_utf8_lossy(&broken));
        }
    }

    /// The object's text with its edits, written member by member: what
    /// `write_to`'s runs must come to.
    fn written_member_by_member(object: &JsonObject<'_>) -> Vec<u8> {
        let text = object.text;
        let (head_end, tail_start) = match (object.members.first(), object.members.last()) {
            (Some(first), Some(last)) => (first.key_start, last.value_end),
            _ => (object.open_end, object.open_end),
        };
        let mut out = text[..head_end].to_vec();
        let (mut wrote_any, mut previous_end) = (false, head_end);
        for member in &object.members {
            let separator = &text[previous_end..member.key_start];
            previous_end = member.value_end;
            let value_start = member.value_end - member.value.len();
            let value = match &member.edit {
                Some(MemberEdit::Remove) => continue,
                Some(MemberEdit::Replace(json)) => json.as_bytes(),
                None => member.value.as_bytes(),
            };
            if wrote_any {
                out.extend_from_slice(separator);
            }
            out.extend_from_slice(&text[member.key_start..value_start]);
            out.extend_from_slice(value);
            wrote_any = true;
        }
        for (name, json) in &object.added {
            if wrote_any {
                out.push(b',');
            }
            out.extend_from_slice(serde_json::to_string(name).unwrap().as_bytes());
            out.push(b':');
            out.extend_from_slice(json.as_bytes());
            wrote_any = true;
        }
        out.extend_from_slice(&text[tail_start..]);
        out
    }

    proptest! {
        /// Copying in runs writes what writing each member in turn does,
        /// whatever is removed, replaced or added.
        #[test]
        fn runs_write_what_each_member_in_turn_would(
            names in proptest::collection::vec("[a-e]", 0..7),
            spaces in proptest::collection::vec("[ \n]{0,2}", 16),
            edits in proptest::collection::vec(0u8..3, 7),
            added in proptest::option::of("[f-g]"),
        ) {
            let members: Vec<String> = names
                .iter()
                .enumerate()
                .map(|(index, name)| format!("{}\"{name}\"{}:{index}", spaces[2 * index], spaces[2 * index + 1]))
                .collect();
            let text = format!("{}{{{}{}}}", spaces[14], members.join(","), spaces[15]);
            let mut object = JsonObject::parse(text.as_bytes()).unwrap();
            for (name, edit) in names.iter().zip(&edits) {
                // A repeated name refuses its edits, leaving the object as it was.
                let _ = match edit {
                    0 => Ok(()),
                    1 => object.remove(name),
                    _ => object.set(name, "[true]".to_owned()),
                };
            }
            if let Some(name) = added {
                object.set(&name, "null".to_owned()).unwrap();
            }
            prop_assert_eq!(object.to_bytes(), written_member_by_member(&object));
        }
    }

    #[test]
    fn a_lone_surrogate_escape_is_read_as_serde_json_skips_it() {
        let text = br#""\udbff""#;
        let mut scan = Scan {
            bytes: text,
            at: 0,
            text_bytes: 0,
            text_key: false,
        };
        assert_eq!(scan.string(), Some(true));
        assert_eq!(scan.at, text.len());
        assert!(serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok());
    }

    proptest! {
        /// A string is read to its end just when serde_json reads it (as
        /// it skips one): quotes, escapes and control characters anywhere
        /// in a long run.
        #[test]
        fn a_string_is_read_as_serde_json_reads_it(
            pieces in proptest::collection::vec(prop_oneof![
                8 => "[a-z\u{e9}\u{1F600} ]{1,40}",
                1 => Just("\"".to_owned()),
                1 => Just("\\".to_owned()),
                1 => "\\\\[nux\"\\\\]",
                1 => "\\\\u00[0-9a-f]{2}",
                1 => "[\x00-\x1f]",
            ], 0..12),
            cut in any::<proptest::sample::Index>(),
        ) {
            let text = format!("\"{}\"", pieces.concat());
            // Whole, and cut short anywhere (a long run may then reach the
            // end of the text before any quote).
            let short = &text.as_bytes()[..cut.index(text.len() + 1)];
            for bytes in [text.as_bytes(), short] {
                let mut scan = Scan { bytes, at: 0, text_bytes: 0, text_key: false };
                let read = scan.string().is_some() && scan.at == bytes.len();
                // As serde_json reads a string it skips: a lone surrogate's
                // escape is four hex digits like any other. serde_json
                // also takes whitespace after the value (a cut after a
                // quote inside the text ends it early), the scanner only
                // the string.
                let skipped = !bytes.last().is_some_and(u8::is_ascii_whitespace)
                    && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok();
                prop_assert_eq!(read, skipped, "{:?}", String::from_utf8_lossy(bytes));
            }
        }
    }

    proptest! {
        #[test]
        fn an_unedited_json_object_comes_back_byte_for_byte(
            members in proptest::collection::vec(("[a-z\\\\\"]{0,4}", "-?[1-9][0-9]{0,2}|0|\"[a-z ]{0,5}\"|\\[\\]|\\{\\}|null|true"), 0..6),
            spaces in proptest::collection::vec("[ \t\r\n]{0,2}", 32),
            removed in 0usize..8,
        ) {
            let mut text = format!("{}{{", spaces[0]);
            for (index, (name, value)) in members.iter().enumerate() {
                if index > 0 {
                    text.push_str(&format!("{},", spaces[4 * index]));
                }
                let name = serde_json::to_string(name).unwrap();
                text.push_str(&format!("{}{name}{}:{}{value}", spaces[4 * index + 1], spaces[4 * index + 2], spaces[4 * index + 3]));
            }
            text.push_str(&format!("{}}}{}", spaces[30], spaces[31]));
            let object = JsonObject::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(object.to_bytes(), text.as_bytes());
            // Removing one member leaves valid JSON with the others as they were.
            if let Some((name, _)) = members.get(removed) {
                let mut object = JsonObject::parse(text.as_bytes()).unwrap();
                if object.remove(name).is_ok() {
                    let out = object.to_bytes();
                    let before: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
                    let mut after: serde_json::Map<String, Value> = serde_json::from_slice(&out).unwrap();
                    let mut expected = before.clone();
                    expected.remove(name);
                    after.sort_keys();
                    expected.sort_keys();
                    prop_assert_eq!(after, expected);
                }
            }
        }

    }

    /// A member of a stream's chunk, from a small pool: some escaped,
    /// some carrying text, some numbers a changed byte can lengthen.
    fn member() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "id", "model", "content", "x", "a\\u0062", "text", "\\\"q",
        ]);
        let value = prop::sample::select(vec![
            "1",
            "\"ab\"",
            "\"c\\\"d\"",
            "{\"content\":\"hi\"}",
            "[1,{\"text\":\"\u{e9}\"}]",
            "null",
            "\"",
        ]);
        let space = prop::sample::select(vec!["", " ", "\n"]);
        (key, space.clone(), value, space)
            .prop_map(|(key, before, value, after)| format!("\"{key}\"{before}:{after}{value}"))
    }

    /// How a chunk's text is spoilt before it is parsed.
    #[derive(Clone, Debug)]
    enum Spoil {
        None,
        Replace(u8),
        Insert(u8),
        Remove,
        Cut,
    }

    /// One chunk of a stream: the last chunk's first members kept (how
    /// many: an index), others added, its text then spoilt at an index.
    type Step = (prop::sample::Index, Vec<String>, Spoil, prop::sample::Index);

    fn stream() -> impl Strategy<Value = (String, Vec<Step>)> {
        let spoil = prop_oneof![
            4 => Just(Spoil::None),
            1 => any::<u8>().prop_map(Spoil::Replace),
            1 => prop::sample::select(b"0 ,:}\"x".to_vec()).prop_map(Spoil::Insert),
            1 => Just(Spoil::Remove),
            1 => Just(Spoil::Cut),
        ];
        let step = (
            any::<prop::sample::Index>(),
            prop::collection::vec(member(), 0..4),
            spoil,
            any::<prop::sample::Index>(),
        );
        (
            prop::sample::select(vec!["", " "]).prop_map(str::to_owned),
            prop::collection::vec(step, 1..12),
        )
    }

    /// Parses the chunks of `steps` one after the other with a memo and
    /// each alone, and holds the two equal.
    fn parse_stream(lead: &str, steps: Vec<Step>) -> Result<(), TestCaseError> {
        let mut memo = ScanMemo::default();
        let mut members: Vec<String> = Vec::new();
        for (kept, added, spoil, at) in steps {
            members.truncate(kept.index(members.len() + 1));
            members.extend(added);
            let mut text = format!("{lead}{{{}}}", members.join(",")).into_bytes();
            let at = at.index(text.len());
            match spoil {
                Spoil::None => {}
                Spoil::Replace(byte) => text[at] = byte,
                Spoil::Insert(byte) => text.insert(at, byte),
                Spoil::Remove => drop(text.remove(at)),
                Spoil::Cut => text.truncate(at),
            }
            prop_assert_eq!(
                shape_of(&text, Some(&mut memo)),
                shape_of(&text, None),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
        Ok(())
    }

    proptest! {
        /// A stream's objects parsed one after the other with a memo read
        /// exactly as each parsed alone: the same members, places, values
        /// and counted text, and the same refusals, whatever the last
        /// object was (its members kept or not, a byte changed, added or
        /// taken out, cut short, not an object at all).
        #[test]
        fn a_parse_after_the_last_object_is_the_plain_parse((lead, steps) in stream()) {
            parse_stream(&lead, steps)?;
        }
    }

    /// The property above goes on from shared members often: a parse that
    /// never did would prove nothing of that path.
    #[test]
    fn the_stream_property_reads_on_from_shared_members() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        RESUMES.with(|resumes| resumes.set(0));
        runner
            .run(&stream(), |(lead, steps)| parse_stream(&lead, steps))
            .unwrap();
        let resumes = RESUMES.with(std::cell::Cell::get);
        assert!(resumes > 100, "{resumes} parses went on from the last");
    }

    #[test]
    fn a_chunk_repeating_the_last_ones_members_is_read_from_where_they_end() {
        let mut memo = ScanMemo::default();
        let first =
            br#"{"id":"c1","model":"m","choices":[{"delta":{"content":"Hel"}}],"usage":null}"#;
        let second =
            br#"{"id":"c1","model":"m","choices":[{"delta":{"content":"lo!"}}],"usage":null}"#;
        assert!(shape_of(first, Some(&mut memo)).is_some());
        assert_eq!(memo.shared_members(second), 2, "id and model");
        assert_eq!(shape_of(second, Some(&mut memo)), shape_of(second, None));
        assert_eq!(shape_of(second, None).unwrap().2, 3, "the text counted");
        // Another chunk id: nothing shared, all read.
        let other = br#"{"id":"c2","model":"m","choices":[],"usage":null}"#;
        assert_eq!(memo.shared_members(other), 0);
        assert_eq!(shape_of(other, Some(&mut memo)), shape_of(other, None));
        // A long chunk is read alone and not kept.
        let long = format!(
            r#"{{"id":"c2","text":"{}"}}"#,
            "a".repeat(ScanMemo::MAX_TEXT_BYTES)
        );
        assert_eq!(
            shape_of(long.as_bytes(), Some(&mut memo)),
            shape_of(long.as_bytes(), None)
        );
        assert!(memo.text.is_empty() && memo.members.is_empty());
        // Of an object with many members, the first 32 are kept.
        let members: Vec<String> = (0..40).map(|index| format!(r#""m{index}":1"#)).collect();
        let many = format!("{{{}}}", members.join(","));
        assert!(shape_of(many.as_bytes(), Some(&mut memo)).is_some());
        assert_eq!(memo.members.len(), ScanMemo::MAX_MEMBERS);
        assert_eq!(
            shape_of(many.as_bytes(), Some(&mut memo)),
            shape_of(many.as_bytes(), None)
        );
    }
}
