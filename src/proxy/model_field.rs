//! [`ReportedModel`]: a response body whose `model` field names the model
//! as the gateway knows it (`openai/gpt-4o`), not as the provider called it
//! (`gpt-4o-2024-08-06`): in a JSON body, and in every `data:` event of a
//! server-sent event stream, passed on event by event.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::value::RawValue;

/// Largest JSON body rewritten; a larger one passes on unchanged.
pub const MAX_REWRITTEN_JSON_BYTES: usize = 8 * 1024 * 1024;
/// Longest SSE line held while waiting for its end; a longer one passes on
/// unchanged.
pub const MAX_SSE_LINE_BYTES: usize = 1024 * 1024;

/// How a body's `model` field is rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// One JSON object: rewritten once it has all arrived.
    Json,
    /// Server-sent events: each `data:` line that is a JSON object.
    EventStream,
    /// Anything else (and error responses): passed on as it is.
    Other,
}

impl BodyKind {
    /// The kind a successful response's headers announce.
    pub fn of(headers: &HeaderMap) -> BodyKind {
        let essence = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .map(|essence| essence.trim().to_ascii_lowercase());
        match essence.as_deref() {
            Some("application/json") => BodyKind::Json,
            Some("text/event-stream") => BodyKind::EventStream,
            _ => BodyKind::Other,
        }
    }
}

/// Replaces the top-level `model` string of a JSON object; `None` when
/// `text` is not a JSON object with a string `model`, or when `model` is
/// already the gateway's (left as it is).
///
/// Only the top level is parsed: every other byte is copied through as
/// the upstream wrote it (a completion's text is never rebuilt).
pub fn rewrite_model_json(text: &[u8], model: &str) -> Option<Vec<u8>> {
    rewrite_json(text, &ServedModel::new(model))
}

/// The model a response is to name, with a searcher for its bytes built
/// once per response rather than once per event.
#[derive(Debug)]
pub(crate) struct ServedModel {
    name: String,
    finder: memchr::memmem::Finder<'static>,
}

impl ServedModel {
    pub(crate) fn new(name: impl Into<String>) -> ServedModel {
        let name = name.into();
        let finder = memchr::memmem::Finder::new(name.as_bytes()).into_owned();
        ServedModel { name, finder }
    }
}

fn rewrite_json(text: &[u8], served: &ServedModel) -> Option<Vec<u8>> {
    // An answer that already names the served model is told by one pass
    // that builds nothing; anything it cannot read (a duplicate `model`,
    // say) takes the full path below. An answer whose bytes do not hold
    // the name at all (a provider's own, the usual case) cannot name it
    // plainly, so it goes straight there; one that names it escaped is
    // still found equal below.
    #[derive(serde::Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow)]
        model: Option<std::borrow::Cow<'a, str>>,
    }
    let model = served.name.as_str();
    if served.finder.find(text).is_some() {
        if let Ok(ModelOnly {
            model: Some(current),
        }) = crate::body::json_from_bytes(text)
        {
            if current == model {
                return None;
            }
        }
    }
    let mut object = JsonObject::parse(text)?;
    // A repeated `model` would leave one unrewritten: refused.
    let current = object.get("model").ok()??;
    let current: String = serde_json::from_str(current).ok()?;
    if current == model {
        return None;
    }
    object
        .set("model", serde_json::to_string(model).ok()?)
        .ok()?;
    Some(object.to_bytes())
}

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

/// A top-level name that appears more than once: which one an edit means
/// is unclear (and the next reader may take the other), so it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeated;

impl<'a> JsonObject<'a> {
    /// `text` read as one JSON object (whitespace around it allowed);
    /// `None` when it is anything else.
    pub(crate) fn parse(text: &'a [u8]) -> Option<JsonObject<'a>> {
        let RawMembers(raw) = crate::body::json_from_bytes(text).ok()?;
        // The raw values are slices of `text`: their place in it, without
        // `unsafe`, is the distance between the two addresses.
        let offset = |part: &str| (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize);
        let open = text.iter().position(|&byte| byte == b'{')?;
        let mut members = Vec::with_capacity(raw.len());
        for (key, value) in raw {
            let key = key.get();
            let value = value.get();
            let key_start = offset(key)?;
            let value_end = offset(value)?.checked_add(value.len())?;
            // In order and inside `text`, as serde_json reads them: checked
            // so that `to_bytes` can slice without a doubt.
            let after_previous = members
                .last()
                .map_or(open < key_start, |previous: &Member<'_>| {
                    previous.value_end <= key_start
                });
            if !after_previous || key_start + key.len() > value_end || value_end > text.len() {
                return None;
            }
            let quoted = key.strip_prefix('"')?.strip_suffix('"')?;
            let name = if quoted.contains('\\') {
                std::borrow::Cow::Owned(serde_json::from_str::<String>(key).ok()?)
            } else {
                std::borrow::Cow::Borrowed(quoted)
            };
            members.push(Member {
                name,
                key_start,
                value,
                value_end,
                edit: None,
            });
        }
        Some(JsonObject {
            text,
            members,
            open_end: open + 1,
            added: Vec::new(),
        })
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
        let text = self.text;
        let extra: usize = self
            .added
            .iter()
            .map(|(name, json)| name.len() + json.len() + 8)
            .sum();
        let mut out = Vec::with_capacity(text.len() + extra);
        // Up to the first member (or the `{` of an empty object), and from
        // the end of the last one: `}` and any whitespace, as they were.
        let (head_end, tail_start) = match (self.members.first(), self.members.last()) {
            (Some(first), Some(last)) => (first.key_start, last.value_end),
            _ => (self.open_end, self.open_end),
        };
        out.extend_from_slice(&text[..head_end]);
        let mut wrote_any = false;
        let mut previous_end = head_end;
        for member in &self.members {
            let separator = &text[previous_end..member.key_start];
            previous_end = member.value_end;
            let value_start = member.value_end - member.value.len();
            let value = match &member.edit {
                Some(MemberEdit::Remove) => continue,
                Some(MemberEdit::Replace(json)) => json.as_bytes(),
                None => member.value.as_bytes(),
            };
            // A kept member keeps the separator (comma and whitespace) that
            // stood before it, unless everything before it was removed.
            if wrote_any {
                out.extend_from_slice(separator);
            }
            out.extend_from_slice(&text[member.key_start..value_start]);
            out.extend_from_slice(value);
            wrote_any = true;
        }
        for (name, json) in &self.added {
            if wrote_any {
                out.push(b',');
            }
            // A `String` always serialises.
            out.extend_from_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
            out.push(b':');
            out.extend_from_slice(json.as_bytes());
            wrote_any = true;
        }
        out.extend_from_slice(&text[tail_start..]);
        out
    }
}

/// A JSON object's top-level members in order, names and values unparsed.
struct RawMembers<'a>(Vec<(&'a RawValue, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for RawMembers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = RawMembers<'a>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

/// A piece of a server-sent event stream, as [`SseLines`] cuts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SsePiece {
    /// One whole line, its line ending included (none on a body's last
    /// line when the body ends without one).
    Line(Bytes),
    /// Part of a line longer than [`MAX_SSE_LINE_BYTES`], to pass on as it
    /// is; the piece that holds the line's end ends with `\n`.
    Long(Bytes),
}

/// Cuts an event stream into lines however its chunks fall, holding at
/// most [`MAX_SSE_LINE_BYTES`] of a line while waiting for its end.
#[derive(Debug, Default)]
pub(crate) struct SseLines {
    held: BytesMut,
    // How far `held` is known to have no `\n`: a line that arrives byte
    // by byte is not searched again from its start each time.
    scanned: usize,
    in_long_line: bool,
}

impl SseLines {
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
        let unscanned = self.held.get(self.scanned..).unwrap_or_default();
        match unscanned.iter().position(|&byte| byte == b'\n') {
            Some(at) => {
                let line = self.held.split_to(self.scanned + at + 1).freeze();
                self.scanned = 0;
                if std::mem::take(&mut self.in_long_line) {
                    Some(SsePiece::Long(line))
                } else {
                    Some(SsePiece::Line(line))
                }
            }
            None if self.in_long_line || self.held.len() > MAX_SSE_LINE_BYTES => {
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
}

/// One SSE line (its line ending included) with the `model` of its
/// `data:` JSON replaced; other lines come back as they are.
pub fn rewrite_model_sse_line(line: &[u8], model: &str) -> Vec<u8> {
    rewrite_sse_line(line, &ServedModel::new(model))
}

fn rewrite_sse_line(line: &[u8], model: &ServedModel) -> Vec<u8> {
    let content_end = line
        .iter()
        .rposition(|&byte| byte != b'\n' && byte != b'\r')
        .map_or(0, |index| index + 1);
    let (content, ending) = line.split_at(content_end);
    let Some(data) = content.strip_prefix(b"data:") else {
        return line.to_vec();
    };
    let payload = data.strip_prefix(b" ").unwrap_or(data);
    match rewrite_json(payload, model) {
        Some(rewritten) => {
            let mut out = Vec::with_capacity(rewritten.len() + 8);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&rewritten);
            out.extend_from_slice(ending);
            out
        }
        None => line.to_vec(),
    }
}

pin_project! {
    /// A response body with its `model` field rewritten (see the module docs).
    #[derive(Debug)]
    pub struct ReportedModel<B> {
        #[pin]
        inner: B,
        model: ServedModel,
        kind: BodyKind,
        held: BytesMut,
        // An event stream's lines.
        lines: SseLines,
        // Set when a JSON body outgrew what is rewritten: the rest passes on.
        passing: bool,
        trailers: Option<HeaderMap>,
        ended: bool,
    }
}

impl<B> ReportedModel<B> {
    /// Wraps `inner`, naming `model` in it as `kind` says.
    pub fn new(inner: B, model: impl Into<String>, kind: BodyKind) -> Self {
        ReportedModel {
            inner,
            model: ServedModel::new(model),
            kind,
            held: BytesMut::new(),
            lines: SseLines::default(),
            passing: kind == BodyKind::Other,
            trailers: None,
            ended: false,
        }
    }
}

impl<B> ReportedModel<B> {
    /// `inner`'s rest after `read`, which was taken from it already; both
    /// pass on unchanged.
    pub fn resume(inner: B, read: BytesMut) -> Self {
        ReportedModel {
            inner,
            model: ServedModel::new(String::new()),
            kind: BodyKind::Other,
            held: read,
            lines: SseLines::default(),
            passing: true,
            trailers: None,
            ended: false,
        }
    }
}

/// A line with its `model` rewritten; an over-long line's piece as it is.
fn rewrite_piece(piece: SsePiece, model: &ServedModel) -> Bytes {
    match piece {
        SsePiece::Line(line) => Bytes::from(rewrite_sse_line(&line, model)),
        SsePiece::Long(part) => part,
    }
}

impl<B> Body for ReportedModel<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        loop {
            if *this.ended {
                if !this.held.is_empty() {
                    let rest = this.held.split().freeze();
                    let out = match this.kind {
                        BodyKind::Json if !*this.passing => {
                            rewrite_json(&rest, this.model).map_or(rest, Bytes::from)
                        }
                        _ => rest,
                    };
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                if let Some(piece) = this.lines.finish() {
                    return Poll::Ready(Some(Ok(Frame::data(rewrite_piece(piece, this.model)))));
                }
                return Poll::Ready(
                    this.trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                );
            }
            let Some(frame) = ready!(this.inner.as_mut().poll_frame(cx)) else {
                *this.ended = true;
                continue;
            };
            let frame = frame?;
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        *this.trailers = Some(trailers);
                    }
                    continue;
                }
            };
            if *this.passing {
                if this.held.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                this.held.extend_from_slice(&data);
                return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
            }
            match this.kind {
                BodyKind::Json => {
                    this.held.extend_from_slice(&data);
                    if this.held.len() > MAX_REWRITTEN_JSON_BYTES {
                        *this.passing = true;
                        return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
                    }
                }
                BodyKind::EventStream => {
                    // Whole lines go on now; a partial one waits for its end.
                    this.lines.push(&data);
                    let mut out = BytesMut::new();
                    while let Some(piece) = this.lines.next_piece() {
                        out.extend_from_slice(&rewrite_piece(piece, this.model));
                    }
                    if out.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                }
                BodyKind::Other => unreachable!("passing from the start"),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.held.is_empty() && self.lines.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The rewritten length differs from the upstream's.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use proptest::prelude::*;
    use serde_json::Value;
    use std::convert::Infallible;

    async fn through(chunks: Vec<&[u8]>, kind: BodyKind) -> Vec<u8> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = chunks
            .into_iter()
            .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
            .collect();
        let body = ReportedModel::new(
            StreamBody::new(futures_util::stream::iter(frames)),
            "openai/gpt-4o",
            kind,
        );
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_json_body_reports_the_gateway_model() {
        let out = through(
            vec![
                br#"{"id": "c1", "model": "gpt-4o-2024-08-06", "#,
                br#""usage": {"total_tokens": 3}}"#,
            ],
            BodyKind::Json,
        )
        .await;
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["model"], "openai/gpt-4o");
        assert_eq!(value["usage"]["total_tokens"], 3);
    }

    #[tokio::test]
    async fn every_sse_event_reports_the_gateway_model_across_chunk_edges() {
        let stream: &[u8] = b"data: {\"model\":\"gpt-4o-x\",\"n\":1}\r\n\r\ndata: {\"mod";
        let rest: &[u8] = b"el\":\"gpt-4o-x\",\"n\":2}\n\n: comment\ndata: [DONE]\n\n";
        let out =
            String::from_utf8(through(vec![stream, rest], BodyKind::EventStream).await).unwrap();
        assert_eq!(
            out.matches("\"model\":\"openai/gpt-4o\"").count(),
            2,
            "{out}"
        );
        assert!(!out.contains("gpt-4o-x"));
        assert!(out.contains("data: {\"model\":\"openai/gpt-4o\",\"n\":1}\r\n\r\n"));
        assert!(out.ends_with(": comment\ndata: [DONE]\n\n"));
    }

    #[tokio::test]
    async fn what_is_not_a_model_object_passes_unchanged() {
        for (input, kind) in [
            (&br#"{"model": 3}"#[..], BodyKind::Json),
            (b"not json", BodyKind::Json),
            (b"[1, 2]", BodyKind::Json),
            (b"data: x\n\nevent: ping\n", BodyKind::EventStream),
            (br#"{"model": "gpt"}"#, BodyKind::Other),
        ] {
            assert_eq!(through(vec![input], kind).await, input, "{kind:?}");
        }
    }

    #[tokio::test]
    async fn an_oversized_body_passes_unchanged() {
        let big = format!(
            r#"{{"model": "gpt", "pad": "{}"}}"#,
            "x".repeat(MAX_REWRITTEN_JSON_BYTES)
        );
        let chunks: Vec<&[u8]> = big.as_bytes().chunks(64 * 1024).collect();
        assert_eq!(through(chunks, BodyKind::Json).await, big.as_bytes());
        let long_line = format!("data: {}", "y".repeat(MAX_SSE_LINE_BYTES + 10));
        let chunks: Vec<&[u8]> = long_line.as_bytes().chunks(64 * 1024).collect();
        assert_eq!(
            through(chunks, BodyKind::EventStream).await,
            long_line.as_bytes()
        );
    }

    /// Found by the `model_field` fuzz target: a number beyond f64's range
    /// is valid JSON; the rewrite keeps it byte for byte (the first version
    /// of the target's check, which built a `Value`, could not read it).
    #[test]
    fn values_pass_byte_for_byte_even_numbers_beyond_f64() {
        let input = br#"{"id":"c","model":"o","usd":8888888e5918888888888}"#;
        let out = rewrite_model_json(input, "p/m").unwrap();
        assert_eq!(
            out,
            br#"{"id":"c","model":"p/m","usd":8888888e5918888888888}"#
        );
        // Already the gateway's model: nothing to rewrite.
        assert_eq!(rewrite_model_json(&out, "p/m"), None);
        // Two `model` fields would leave one unrewritten: refused, passed on as is.
        assert_eq!(
            rewrite_model_json(br#"{"model":"a","model":"b"}"#, "p/m"),
            None
        );
    }

    #[test]
    fn the_gateway_model_written_with_escapes_is_still_the_gateway_model() {
        // Its bytes do not hold the name as such; it is the same name.
        for text in [
            &br#"{"model":"p\/m"}"#[..],
            br#"{"model":"\u0070/m","n":1}"#,
        ] {
            assert_eq!(rewrite_model_json(text, "p/m"), None);
        }
        // The name elsewhere, the model another: rewritten.
        assert_eq!(
            rewrite_model_json(br#"{"model":"x","text":"p/m"}"#, "p/m").unwrap(),
            br#"{"model":"p/m","text":"p/m"}"#
        );
    }

    #[test]
    fn the_kind_follows_the_content_type() {
        let kind = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::CONTENT_TYPE, value.parse().unwrap());
            BodyKind::of(&headers)
        };
        assert_eq!(kind("application/json; charset=utf-8"), BodyKind::Json);
        assert_eq!(kind("Text/Event-Stream"), BodyKind::EventStream);
        assert_eq!(kind("text/plain"), BodyKind::Other);
        assert_eq!(BodyKind::of(&HeaderMap::new()), BodyKind::Other);
    }

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

    #[tokio::test]
    async fn events_after_an_over_long_line_are_rewritten_again() {
        let mut stream = format!("data: {}\n\n", "y".repeat(MAX_SSE_LINE_BYTES + 10)).into_bytes();
        stream.extend_from_slice(b"data: {\"model\":\"up\"}\n\n");
        let chunks: Vec<&[u8]> = stream.chunks(64 * 1024).collect();
        let out = through(chunks, BodyKind::EventStream).await;
        let (long, rest) = out.split_at(MAX_SSE_LINE_BYTES + 18);
        assert_eq!(long, &stream[..MAX_SSE_LINE_BYTES + 18]);
        assert_eq!(rest, b"data: {\"model\":\"openai/gpt-4o\"}\n\n");
    }

    proptest! {
        #[test]
        fn sse_lines_keep_everything_but_the_model(id in "[a-z0-9-]{1,12}", n in 0u32..1000, crlf: bool) {
            let ending = if crlf { "\r\n" } else { "\n" };
            let line = format!("data: {{\"id\":\"{id}\",\"model\":\"up-{id}\",\"n\":{n}}}{ending}");
            let out = String::from_utf8(rewrite_model_sse_line(line.as_bytes(), "p/m")).unwrap();
            prop_assert!(out.ends_with(ending));
            let value: Value = serde_json::from_str(out.trim_end().strip_prefix("data: ").unwrap()).unwrap();
            prop_assert_eq!(&value["model"], "p/m");
            prop_assert_eq!(&value["id"], id.as_str());
            prop_assert_eq!(&value["n"], n);
        }

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

        #[test]
        fn any_chunking_of_a_stream_gives_the_same_output(cut in 1usize..200, bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut stream = b"data: {\"model\":\"a\"}\n\n".to_vec();
            stream.extend_from_slice(&bytes);
            let whole = runtime.block_on(through(vec![&stream], BodyKind::EventStream));
            let parts: Vec<&[u8]> = stream.chunks(cut).collect();
            let chunked = runtime.block_on(through(parts, BodyKind::EventStream));
            prop_assert_eq!(whole, chunked);
        }
    }
}
