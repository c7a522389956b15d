//! [`HiddenUsage`]: a streamed answer as the client would have had it had
//! the gateway not asked the upstream for usage on its behalf.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::stream::{StreamEdits, StreamReader};
use crate::edit::{MAX_SSE_LINE_BYTES, SseEvents};

pin_project! {
    /// A server-sent event stream of chat completion chunks with the usage
    /// the gateway asked for taken out again.
    ///
    /// Asked for usage (`stream_options.include_usage`), an OpenAI-style
    /// upstream adds `"usage": null` to every chunk and sends one more
    /// chunk, before `data: [DONE]`, whose `choices` is empty and which
    /// carries the usage. When the client did not ask, it must not see
    /// either: [`HiddenUsage::new`] drops that event whole (its `id:` or
    /// `event:` lines and the blank line that ends it too) and removes a
    /// top-level `"usage": null` from the other chunks, every other byte
    /// of them as the upstream sent it. A chunk whose `choices` is not
    /// empty keeps a `usage` that is not null. Everything else passes
    /// byte for byte: comments, other fields, data that is not JSON, an
    /// event with more than one `data:` line, line endings, and any line
    /// longer than [`MAX_SSE_LINE_BYTES`] with the rest of its event.
    ///
    /// An event is held until its blank line (a client acts on nothing
    /// sooner); a comment between events passes at once, so keep-alives
    /// still keep the connection alive. Errors and trailers of the inner
    /// body pass through. Wrap the body that reads the usage, not the
    /// other way round: this one hides what that one must see.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use modelgate::credit::HiddenUsage;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let upstream = concat!(
    ///     "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
    ///     "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
    ///     "data: [DONE]\n\n",
    /// );
    /// let body = HiddenUsage::new(Full::new(Bytes::from_static(upstream.as_bytes())));
    /// let client_sees = body.collect().await.unwrap().to_bytes();
    /// assert_eq!(
    ///     client_sees,
    ///     "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
    /// );
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct HiddenUsage<B> {
        #[pin]
        inner: B,
        // `None`: the client asked for usage itself; nothing is changed.
        filter: Option<Filter>,
        trailers: Option<HeaderMap>,
        ended: bool,
    }
}

impl<B> HiddenUsage<B> {
    /// Takes the usage the gateway asked for out of `inner`, an event
    /// stream.
    pub fn new(inner: B) -> Self {
        HiddenUsage {
            inner,
            filter: Some(Filter::default()),
            trailers: None,
            ended: false,
        }
    }

    /// Passes `inner` on unchanged: for a client that asked for usage
    /// itself, or an answer that is not an event stream.
    pub fn passthrough(inner: B) -> Self {
        HiddenUsage {
            inner,
            filter: None,
            trailers: None,
            ended: false,
        }
    }
}

impl<B> Body for HiddenUsage<B>
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
        let Some(filter) = this.filter.as_mut() else {
            loop {
                match ready!(this.inner.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) if frame.data_ref().is_some_and(Bytes::is_empty) => continue,
                    other => return Poll::Ready(other),
                }
            }
        };
        loop {
            if *this.ended {
                let mut out = BytesMut::new();
                filter.finish(&mut out);
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
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
            match frame?.into_data() {
                Ok(data) => {
                    let mut out = BytesMut::new();
                    filter.feed(&data, &mut out);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                }
                // Held until the data before them has gone.
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        *this.trailers = Some(trailers);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.filter {
            None => self.inner.is_end_stream(),
            Some(filter) => self.ended && filter.is_empty() && self.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.filter {
            None => self.inner.size_hint(),
            // What is taken out is not known in advance.
            Some(_) => SizeHint::default(),
        }
    }
}

/// The filter's state between chunks: the events, and the reader that
/// takes the usage out of them.
#[derive(Debug)]
struct Filter {
    events: SseEvents,
    reader: StreamReader,
}

impl Default for Filter {
    fn default() -> Self {
        let edits = StreamEdits {
            hide_usage: true,
            served_model: None,
        };
        Filter {
            events: SseEvents::editing(MAX_SSE_LINE_BYTES),
            reader: StreamReader::new(edits, MAX_SSE_LINE_BYTES),
        }
    }
}

impl Filter {
    fn feed(&mut self, data: &[u8], out: &mut BytesMut) {
        self.events.feed(data, &mut self.reader, out);
    }

    fn finish(&mut self, out: &mut BytesMut) {
        self.events.finish(&mut self.reader, out);
    }

    fn is_empty(&self) -> bool {
        self.events.between_events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use proptest::prelude::*;
    use std::convert::Infallible;

    fn frames(chunks: Vec<Vec<u8>>) -> Vec<Result<Frame<Bytes>, Infallible>> {
        chunks
            .into_iter()
            .map(|chunk| Ok(Frame::data(Bytes::from(chunk))))
            .collect()
    }

    /// The frames `HiddenUsage::new` gives for `chunks`, by polling by hand
    /// (every inner frame is ready at once).
    fn filtered_frames(chunks: Vec<Vec<u8>>) -> Vec<Frame<Bytes>> {
        let body = HiddenUsage::new(StreamBody::new(futures_util::stream::iter(frames(chunks))));
        let mut body = std::pin::pin!(body);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
            out.push(frame.unwrap());
        }
        assert!(body.is_end_stream());
        out
    }

    fn filtered(chunks: Vec<Vec<u8>>) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in filtered_frames(chunks) {
            let data = frame.into_data().expect("data frames only");
            assert!(!data.is_empty(), "an empty data frame");
            out.extend_from_slice(&data);
        }
        out
    }

    fn whole(stream: &str) -> String {
        String::from_utf8(filtered(vec![stream.as_bytes().to_vec()])).unwrap()
    }

    /// What an OpenAI-style upstream sends with `include_usage`, and what
    /// it sends without.
    const ASKED: &str = concat!(
        ": OPENROUTER PROCESSING\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\\u00e9 \\\"usage\\\"\"}}], \"usage\" : null ,\"x\":1.50}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n",
        "data: [DONE]\n\n",
    );
    const NOT_ASKED: &str = concat!(
        ": OPENROUTER PROCESSING\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\\u00e9 \\\"usage\\\"\"}}] ,\"x\":1.50}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn the_client_gets_the_stream_it_would_have_had() {
        assert_eq!(whole(ASKED), NOT_ASKED);
        // What is already without usage passes untouched.
        assert_eq!(whole(NOT_ASKED), NOT_ASKED);
    }

    #[test]
    fn any_split_and_byte_by_byte_give_the_same_stream() {
        for crlf in [false, true] {
            let (asked, not_asked) = if crlf {
                (ASKED.replace('\n', "\r\n"), NOT_ASKED.replace('\n', "\r\n"))
            } else {
                (ASKED.to_owned(), NOT_ASKED.to_owned())
            };
            let bytes = asked.as_bytes();
            for cut in 0..=bytes.len() {
                let out = filtered(vec![bytes[..cut].to_vec(), bytes[cut..].to_vec()]);
                assert_eq!(out, not_asked.as_bytes(), "cut at {cut}, crlf {crlf}");
            }
            let bytewise = filtered(bytes.iter().map(|&byte| vec![byte]).collect());
            assert_eq!(bytewise, not_asked.as_bytes());
        }
    }

    #[test]
    fn the_usage_event_goes_with_its_other_fields() {
        let stream = concat!(
            "id: 1\nevent: message\ndata: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n",
            "id: 2\nevent: message\ndata: {\"choices\": [ ], \"usage\": {\"total_tokens\": 3}}\nretry: 10\n\n",
            "id: 3\ndata: [DONE]\n\n",
        );
        assert_eq!(
            whole(stream),
            concat!(
                "id: 1\nevent: message\ndata: {\"choices\":[{\"delta\":{}}]}\n\n",
                "id: 3\ndata: [DONE]\n\n",
            )
        );
    }

    #[test]
    fn usage_with_choices_stays_unless_null() {
        // Some upstreams put the usage in the last chunk with choices: the
        // client keeps that chunk, usage and all.
        let last = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"total_tokens\":3}}\n\n";
        assert_eq!(whole(last), last);
        // Usage but no `choices` at all: not the usage-only chunk.
        let odd = "data: {\"usage\":{\"total_tokens\":3}}\n\n";
        assert_eq!(whole(odd), odd);
        // A null usage goes, wherever the chunk is; `choices: []` stays.
        assert_eq!(
            whole("data: {\"usage\":null,\"choices\":[]}\n\n"),
            "data: {\"choices\":[]}\n\n"
        );
        assert_eq!(
            whole("data:{\"\\u0075sage\":null}\n\n"),
            "data:{}\n\n",
            "an escaped name is the same name"
        );
    }

    #[test]
    fn everything_else_passes_byte_for_byte() {
        for stream in [
            ": keep-alive\n\n",
            ": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\n",
            "event: ping\ndata: x\n\n",
            "data: not json \"usage\": null\n\n",
            "data: [\"usage\", null]\n\n",
            "data: {\"usage\":null,\"usage\":null}\n\n",
            "data: {\"nested\":{\"usage\":null}}\n\n",
            "data: {\"usage\":null,\ndata: \"x\":1}\n\n",
            "data\n\n",
            "retry: 100\n\nid\n\n",
            "\n\n\n",
            "",
        ] {
            assert_eq!(whole(stream), stream);
        }
    }

    #[test]
    fn an_event_not_ended_by_a_blank_line_is_filtered_all_the_same() {
        assert_eq!(whole("data: {\"a\":1,\"usage\":null}"), "data: {\"a\":1}");
        assert_eq!(
            whole("data: {\"a\":1,\"usage\":null}\r\n"),
            "data: {\"a\":1}\r\n"
        );
        assert_eq!(whole("data: {\"choices\":[],\"usage\":{}}\n"), "");
    }

    #[test]
    fn a_comment_inside_an_event_stays_in_its_place() {
        let stream = "data: {\"usage\":null}\n: note\nid: 4\n\n";
        assert_eq!(whole(stream), "data: {}\n: note\nid: 4\n\n");
    }

    #[test]
    fn an_over_long_line_passes_with_its_event_and_the_next_event_is_filtered() {
        let long = format!(
            "id: 1\ndata: {{\"usage\":null,\"pad\":\"{}\"}}\n\n",
            "y".repeat(MAX_SSE_LINE_BYTES)
        );
        let stream = format!("{long}data: {{\"usage\":null}}\n\n");
        let chunks: Vec<Vec<u8>> = stream
            .as_bytes()
            .chunks(7 * 1024)
            .map(<[u8]>::to_vec)
            .collect();
        let out = filtered(chunks);
        assert_eq!(&out[..long.len()], long.as_bytes());
        assert_eq!(&out[long.len()..], b"data: {}\n\n");
        // Many lines in one event: held up to the same bound, then passed.
        let many = format!(
            "{}data: {{\"choices\":[],\"usage\":{{}}}}\n\n",
            "id: 1\n".repeat(MAX_SSE_LINE_BYTES / 6 + 1)
        );
        let chunks: Vec<Vec<u8>> = many
            .as_bytes()
            .chunks(64 * 1024)
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(filtered(chunks), many.as_bytes());
    }

    #[test]
    fn no_empty_data_frame_comes_out() {
        let frames = filtered_frames(vec![
            Vec::new(),
            b"data: {\"choices\":[],\"usage\":{}}\n\n".to_vec(),
            b"data: {\"choices\":[]".to_vec(),
            b",\"usage\":{}}\n".to_vec(),
            b"\n".to_vec(),
        ]);
        assert!(frames.is_empty(), "{frames:?}");
    }

    #[tokio::test]
    async fn the_passthrough_changes_nothing() {
        let frames = frames(vec![Vec::new(), ASKED.as_bytes().to_vec()]);
        let body = HiddenUsage::passthrough(StreamBody::new(futures_util::stream::iter(frames)));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected, ASKED.as_bytes());
        let full = HiddenUsage::passthrough(http_body_util::Full::new(Bytes::from_static(b"abc")));
        assert_eq!(full.size_hint().exact(), Some(3));
        assert!(!full.is_end_stream());
    }

    #[tokio::test]
    async fn trailers_come_after_the_held_data_and_errors_pass() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage", "1".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"data: {\"usage\":null}"))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let body = HiddenUsage::new(StreamBody::new(futures_util::stream::iter(frames)));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "data: {}");

        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
            Err(std::io::Error::other("reset")),
        ];
        for body in [
            HiddenUsage::new(StreamBody::new(futures_util::stream::iter(
                frames.iter().map(clone_frame),
            ))),
            HiddenUsage::passthrough(StreamBody::new(futures_util::stream::iter(
                frames.iter().map(clone_frame),
            ))),
        ] {
            let error = body.collect().await.unwrap_err();
            assert_eq!(error.to_string(), "reset");
        }
    }

    fn clone_frame(
        frame: &Result<Frame<Bytes>, std::io::Error>,
    ) -> Result<Frame<Bytes>, std::io::Error> {
        match frame {
            Ok(frame) => Ok(Frame::data(frame.data_ref().cloned().unwrap_or_default())),
            Err(error) => Err(std::io::Error::other(error.to_string())),
        }
    }

    /// One event as an upstream asked for usage sends it, and as the
    /// client would have had it.
    fn event() -> impl Strategy<Value = (String, String)> {
        let text = "[a-z \\\\\"é]{0,12}";
        prop_oneof![
            (text, any::<bool>()).prop_map(|(content, usage_first)| {
                let content = serde_json::to_string(&content).unwrap();
                let choices = format!("\"choices\":[{{\"delta\":{{\"content\":{content}}}}}]");
                let asked = if usage_first {
                    format!("data: {{\"usage\":null,{choices}}}\n\n")
                } else {
                    format!("data: {{{choices},\"usage\":null}}\n\n")
                };
                (asked, format!("data: {{{choices}}}\n\n"))
            }),
            (0u32..1000).prop_map(|tokens| {
                (
                    format!(
                        "data: {{\"choices\":[],\"usage\":{{\"completion_tokens\":{tokens}}}}}\n\n"
                    ),
                    String::new(),
                )
            }),
            Just((": keep-alive\n\n".to_owned(), ": keep-alive\n\n".to_owned())),
            Just(("data: [DONE]\n\n".to_owned(), "data: [DONE]\n\n".to_owned())),
            "(event|id|retry|data): [a-z{}\":, ]{0,16}\n\n".prop_map(|line| (line.clone(), line)),
        ]
    }

    fn chunked(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for cut in cuts {
            chunks.push(stream[from..cut].to_vec());
            from = cut;
        }
        chunks.push(stream[from..].to_vec());
        chunks
    }

    proptest! {
        #[test]
        fn a_stream_cut_anywhere_comes_out_as_if_usage_was_never_asked_for(
            events in proptest::collection::vec(event(), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            crlf: bool,
        ) {
            let (mut asked, mut not_asked): (String, String) = events.into_iter().unzip();
            if crlf {
                asked = asked.replace('\n', "\r\n");
                not_asked = not_asked.replace('\n', "\r\n");
            }
            let out = filtered(chunked(asked.as_bytes(), &cuts));
            prop_assert_eq!(String::from_utf8(out).unwrap(), not_asked);
        }

        #[test]
        fn any_bytes_cut_anywhere_give_what_they_give_whole(
            bytes in proptest::collection::vec(prop_oneof![
                Just(b'\n'), Just(b'\r'), Just(b':'), Just(b'{'), Just(b'}'), Just(b'"'), any::<u8>()
            ], 0..200),
            prefix in "(data: \\{\"usage\":null\\}\n)?(data: \\{\"choices\":\\[\\],\"usage\":1\\}\n\n)?",
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut stream = prefix.into_bytes();
            stream.extend_from_slice(&bytes);
            let whole = filtered(vec![stream.clone()]);
            prop_assert_eq!(filtered(chunked(&stream, &cuts)), whole.clone());
            // Only ever taken out.
            prop_assert!(whole.len() <= stream.len());
        }

        #[test]
        fn a_stream_without_usage_passes_unchanged(
            lines in proptest::collection::vec("(data: |: |event: |id: )?[a-z{}\\[\\]\":,\r ]{0,20}\r?\n?", 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let stream = lines.concat();
            prop_assume!(!stream.contains("usage"));
            prop_assert_eq!(filtered(chunked(stream.as_bytes(), &cuts)), stream.as_bytes());
        }
    }
}
