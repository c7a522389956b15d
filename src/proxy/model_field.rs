//! [`ReportedModel`]: a response body whose `model` field names the model
//! as the gateway knows it (`openai/gpt-4o`), not as the provider called it
//! (`gpt-4o-2024-08-06`): in a JSON body, and in every `data:` event of a
//! server-sent event stream, passed on event by event.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::edit::{JsonObject, ServedModel, SseLines, SsePiece};

/// Largest JSON body rewritten; a larger one passes on unchanged.
pub const MAX_REWRITTEN_JSON_BYTES: usize = crate::edit::MAX_NAMED_JSON_BYTES;

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

fn rewrite_json(text: &[u8], served: &ServedModel) -> Option<Vec<u8>> {
    let mut object = JsonObject::parse(text)?;
    served.name_in(&mut object).then(|| object.to_bytes())
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
        SsePiece::Long(part) | SsePiece::LineEnd(part) => part,
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
    use crate::edit::MAX_SSE_LINE_BYTES;
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

    /// CreditGuard's one pass over a stream, hiding usage and naming
    /// `model`.
    fn one_pass(stream: &[u8], model: &str) -> Vec<u8> {
        use crate::credit::{StreamEdits, StreamReader};
        let edits = StreamEdits {
            hide_usage: true,
            served_model: Some(crate::edit::ServedModel::new(model)),
        };
        let mut events = crate::edit::SseEvents::editing(MAX_SSE_LINE_BYTES);
        let mut reader = StreamReader::new(edits, usize::MAX);
        let mut out = BytesMut::new();
        events.feed(stream, &mut reader, &mut out);
        events.finish(&mut reader, &mut out);
        out.to_vec()
    }

    proptest! {
        /// The one pass that parses each chunk once gives the client what
        /// the two layers' own passes give: the usage hidden, then each
        /// `data` line naming the model.
        #[test]
        fn the_one_pass_equals_hiding_then_naming(
            events in proptest::collection::vec("(: ka\n\n|event: x\n|data: \\{\"model\":\"(up|m)\",\"choices\":\\[(\\{\"d\":1\\})?\\],\"usage\":(null|\\{\"prompt_tokens\":[0-9]\\})\\}\n\n|data: \\{\"model\":1\\}\n\n|data: \\[DONE\\]\n\n|data: x\n\n)", 0..10),
            crlf: bool,
        ) {
            let mut stream = events.concat();
            if crlf {
                stream = stream.replace('\n', "\r\n");
            }
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let hidden = runtime.block_on(async {
                crate::credit::HiddenUsage::new(http_body_util::Full::new(Bytes::from(stream.clone())))
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes()
            });
            let two_passes = runtime.block_on(through(vec![&hidden], BodyKind::EventStream));
            prop_assert_eq!(
                String::from_utf8(one_pass(stream.as_bytes(), "openai/gpt-4o")).unwrap(),
                String::from_utf8(two_passes).unwrap()
            );
        }
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
