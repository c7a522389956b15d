//! [`TranslatedBody`]: an upstream's answer in the client's API, as the
//! body of the client's response.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::response::{chat_response_to_messages, messages_response_to_chat, untranslatable};
use super::responses_response::chat_response_to_responses;
use super::responses_stream::ChatToResponsesEvents;
use super::stream::{ChatToMessagesEvents, MessagesToChatEvents};
use crate::error::GatewayError;
use crate::response_body::BoxError;

/// Largest whole (non-streamed) answer translated: it is held to its end
/// to be read at once. A larger one fails the body with a 502.
pub(crate) const MAX_TRANSLATED_JSON_BYTES: usize = 16 * 1024 * 1024;

/// Which translation a [`TranslatedBody`] applies to the upstream's
/// successful answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Translation {
    /// A chat completion (or its stream) for a Messages client.
    ChatToMessages {
        /// Whether the answer is a stream of server-sent events.
        stream: bool,
    },
    /// A Messages answer (or its stream) for a chat client.
    MessagesToChat {
        /// Whether the answer is a stream of server-sent events.
        stream: bool,
    },
    /// A chat completion (or its stream) for a Responses client.
    ChatToResponses {
        /// Whether the answer is a stream of server-sent events.
        stream: bool,
    },
}

#[derive(Debug)]
enum State {
    ChatToMessages(ChatToMessagesEvents),
    MessagesToChat(MessagesToChatEvents),
    ChatToResponses(ChatToResponsesEvents),
    Whole {
        translate: fn(&[u8]) -> Result<Bytes, GatewayError>,
        held: BytesMut,
    },
}

pin_project! {
    /// An upstream's successful answer translated for the client: a stream
    /// event by event as its bytes come, a whole answer once all of it has
    /// come (up to [`MAX_TRANSLATED_JSON_BYTES`]). A whole answer that
    /// cannot be translated ends the body with a [`GatewayError`](crate::error::GatewayError)
    /// (502) as its error, which the ErrorMapper renders when it is met
    /// before the response's head; a stream says what went wrong in its own
    /// events (see [`ChatToMessagesEvents`], [`MessagesToChatEvents`]).
    /// Nothing here panics on what the upstream sends.
    #[derive(Debug)]
    pub(crate) struct TranslatedBody<B> {
        #[pin]
        inner: B,
        state: State,
        trailers: Option<HeaderMap>,
        ended: bool,
    }
}

impl<B> TranslatedBody<B> {
    /// `inner`, the upstream's body, translated as `translation` says.
    pub(crate) fn new(inner: B, translation: Translation) -> Self {
        let state = match translation {
            Translation::ChatToMessages { stream: true } => {
                State::ChatToMessages(ChatToMessagesEvents::new())
            }
            Translation::MessagesToChat { stream: true } => {
                State::MessagesToChat(MessagesToChatEvents::new())
            }
            Translation::ChatToResponses { stream: true } => {
                State::ChatToResponses(ChatToResponsesEvents::new())
            }
            Translation::ChatToMessages { stream: false } => State::Whole {
                translate: chat_response_to_messages,
                held: BytesMut::new(),
            },
            Translation::MessagesToChat { stream: false } => State::Whole {
                translate: messages_response_to_chat,
                held: BytesMut::new(),
            },
            Translation::ChatToResponses { stream: false } => State::Whole {
                translate: chat_response_to_responses,
                held: BytesMut::new(),
            },
        };
        TranslatedBody {
            inner,
            state,
            trailers: None,
            ended: false,
        }
    }
}

impl<B> Body for TranslatedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.ended {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let Some(frame) = ready!(this.inner.as_mut().poll_frame(cx)) else {
                *this.ended = true;
                let out = match this.state {
                    State::ChatToMessages(events) => events.finish(),
                    State::MessagesToChat(events) => events.finish(),
                    State::ChatToResponses(events) => events.finish(),
                    State::Whole { translate, held } => {
                        let whole = held.split().freeze();
                        match translate(&whole) {
                            Ok(bytes) => bytes,
                            Err(error) => return Poll::Ready(Some(Err(Box::new(error)))),
                        }
                    }
                };
                if out.is_empty() {
                    continue;
                }
                return Poll::Ready(Some(Ok(Frame::data(out))));
            };
            let frame = frame.map_err(Into::into)?;
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        *this.trailers = Some(trailers);
                    }
                    continue;
                }
            };
            let out = match this.state {
                State::ChatToMessages(events) => events.push(&data),
                State::MessagesToChat(events) => events.push(&data),
                State::ChatToResponses(events) => events.push(&data),
                State::Whole { held, .. } => {
                    if held.len() + data.len() > MAX_TRANSLATED_JSON_BYTES {
                        *this.ended = true;
                        held.clear();
                        let error = untranslatable(&format!(
                            "it is larger than {MAX_TRANSLATED_JSON_BYTES} bytes, the most the gateway translates"
                        ));
                        return Poll::Ready(Some(Err(Box::new(error))));
                    }
                    held.extend_from_slice(&data);
                    continue;
                }
            };
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The translation's length differs from the upstream's.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use serde_json::{Value, json};
    use std::convert::Infallible;

    fn body(
        chunks: Vec<Vec<u8>>,
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
        StreamBody::new(futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok(Frame::data(Bytes::from(chunk)))),
        ))
    }

    async fn collect(chunks: Vec<Vec<u8>>, translation: Translation) -> Result<Bytes, BoxError> {
        TranslatedBody::new(body(chunks), translation)
            .collect()
            .await
            .map(|collected| collected.to_bytes())
    }

    #[tokio::test]
    async fn a_whole_answer_is_translated_once_it_has_all_come() {
        let answer = json!({"id": "c", "model": "m", "choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
        .to_string()
        .into_bytes();
        let (head, tail) = answer.split_at(7);
        let out = collect(
            vec![head.to_vec(), tail.to_vec()],
            Translation::ChatToMessages { stream: false },
        )
        .await
        .unwrap();
        let message: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(message["content"], json!([{"type": "text", "text": "Hi"}]));
        assert_eq!(message["usage"]["input_tokens"], 9);
        let back = collect(
            vec![out.to_vec()],
            Translation::MessagesToChat { stream: false },
        )
        .await
        .unwrap();
        let chat: Value = serde_json::from_slice(&back).unwrap();
        assert_eq!(chat["choices"][0]["message"]["content"], "Hi");
        assert_eq!(chat["usage"]["prompt_tokens"], 9);
    }

    #[tokio::test]
    async fn a_whole_answer_that_cannot_be_translated_ends_the_body_with_a_gateway_error() {
        let error = collect(
            vec![b"<html>".to_vec()],
            Translation::MessagesToChat { stream: false },
        )
        .await
        .unwrap_err();
        let error = error
            .downcast_ref::<GatewayError>()
            .expect("a GatewayError");
        assert_eq!(error.status(), 502);
        let big = vec![b' '; MAX_TRANSLATED_JSON_BYTES / 2 + 1];
        let error = collect(
            vec![big.clone(), big],
            Translation::ChatToMessages { stream: false },
        )
        .await
        .unwrap_err();
        assert_eq!(error.downcast_ref::<GatewayError>().unwrap().status(), 502);
    }

    #[tokio::test]
    async fn a_chat_answer_is_translated_for_a_responses_client() {
        let answer = json!({"id": "c", "model": "m", "choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
        .to_string()
        .into_bytes();
        let (head, tail) = answer.split_at(7);
        let out = collect(
            vec![head.to_vec(), tail.to_vec()],
            Translation::ChatToResponses { stream: false },
        )
        .await
        .unwrap();
        let response: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(response["object"], "response");
        assert_eq!(response["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(response["usage"]["input_tokens"], 9);
        let error = collect(
            vec![b"<html>".to_vec()],
            Translation::ChatToResponses { stream: false },
        )
        .await
        .unwrap_err();
        assert_eq!(error.downcast_ref::<GatewayError>().unwrap().status(), 502);
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n".to_vec();
        let pieces: Vec<Vec<u8>> = stream.chunks(5).map(<[u8]>::to_vec).collect();
        let out = collect(pieces, Translation::ChatToResponses { stream: true })
            .await
            .unwrap();
        let mut direct = ChatToResponsesEvents::new();
        let mut expected = direct.push(&stream).to_vec();
        expected.extend_from_slice(&direct.finish());
        assert_eq!(out.to_vec(), expected);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("event: response.created\n"), "{text}");
        assert!(text.contains("event: response.completed\n"), "{text}");
    }

    #[tokio::test]
    async fn a_stream_is_translated_chunk_by_chunk() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_vec();
        let pieces: Vec<Vec<u8>> = stream.chunks(5).map(<[u8]>::to_vec).collect();
        let out = collect(pieces, Translation::ChatToMessages { stream: true })
            .await
            .unwrap();
        let mut direct = ChatToMessagesEvents::new();
        let mut expected = direct.push(&stream).to_vec();
        expected.extend_from_slice(&direct.finish());
        assert_eq!(out.to_vec(), expected);
        assert!(
            String::from_utf8_lossy(&out)
                .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
        );
        let out = collect(Vec::new(), Translation::MessagesToChat { stream: true })
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("data: {\"error\":"), "{text}");
    }
}
