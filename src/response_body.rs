//! The response body every layer answers with: the inner service's body,
//! untouched, or a rejection rendered by [`GatewayError`](crate::error::GatewayError).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

/// A boxed error, as `tower` and `hyper` use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `error` and every error it wraps, outermost first: what a layer inspects
/// to learn why a body or a service failed.
pub(crate) fn causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |current| current.source())
}

pin_project! {
    /// Either the inner service's response body, passed through frame by
    /// frame (streams stay streams), or a complete body the layer wrote.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProjection]
    #[derive(Debug)]
    enum Kind<B> {
        Full { #[pin] body: Full<Bytes> },
        Inner { #[pin] body: B },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// A complete body of `bytes`.
    pub fn full(bytes: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                body: Full::new(bytes),
            },
        }
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(bytes: Bytes) -> Self {
        ResponseBody::full(bytes)
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::full(Bytes::new())
    }
}

impl<B> Body for ResponseBody<B>
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
        match self.project().kind.project() {
            KindProjection::Full { body } => body.poll_frame(cx).map_err(|never| match never {}),
            KindProjection::Inner { body } => body.poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { body } => body.is_end_stream(),
            Kind::Inner { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { body } => body.size_hint(),
            Kind::Inner { body } => body.size_hint(),
        }
    }
}
