//! A stack checked as it is built: each layer's reading of the context
//! against what the layers outside it add.

use std::fmt;

use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};
use tower_layer::Layer;

/// A part of the [`RequestContext`](super::RequestContext) one layer adds
/// and another reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextPart {
    /// The caller (`principal`), added by BearerAuth.
    Principal,
    /// The parsed chat request (`chat`) and the body's bytes (`body`),
    /// added by BodyLimit.
    ParsedBody,
}

impl ContextPart {
    /// The layer that adds this part in modelgate's stacks.
    pub fn added_by(self) -> &'static str {
        match self {
            ContextPart::Principal => "BearerAuth",
            ContextPart::ParsedBody => "BodyLimit",
        }
    }
}

impl fmt::Display for ContextPart {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            ContextPart::Principal => "the caller's principal",
            ContextPart::ParsedBody => "the parsed request body",
        })
    }
}

/// A layer's dealings with the request's context: what it reads, which a
/// layer outside it must add, and what it adds for the layers inside.
///
/// Used alone, a layer that finds a part missing answers 500 naming the
/// layer it lacks; stacked through [`CheckedStack`], the stack is refused
/// when it is built.
pub trait ContextLayer {
    /// The layer's name in messages.
    const NAME: &'static str;

    /// The parts it reads.
    fn reads(&self) -> &'static [ContextPart] {
        &[]
    }

    /// The parts it adds.
    fn adds(&self) -> &'static [ContextPart] {
        &[]
    }
}

/// A stack in which a layer reads a part no layer outside it adds: see
/// [`CheckedStack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingLayer {
    /// The layer that reads the part.
    pub layer: &'static str,
    /// The part no layer before it adds.
    pub part: ContextPart,
}

impl fmt::Display for MissingLayer {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} reads {}, which no layer before it adds: stack {} outside it",
            self.layer,
            self.part,
            self.part.added_by()
        )
    }
}

impl std::error::Error for MissingLayer {}

/// A [`ServiceBuilder`] that checks each [`ContextLayer`] against the
/// layers added before it (outside it), so a stack that lacks a layer is
/// an error when it is built rather than a 500 on each request.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use modelgate::auth::BearerAuthLayer;
/// use modelgate::body::BodyLimitLayer;
/// use modelgate::context::CheckedStack;
/// use modelgate::credit::{CreditGuardLayer, PriceTable};
/// use modelgate::error_mapper::ErrorMapperLayer;
/// use modelgate::keys::{KeyDirectory, SharedStore};
/// use modelgate::store::MemoryStore;
/// use std::sync::Arc;
/// use tower::service_fn;
///
/// let store: SharedStore = Arc::new(MemoryStore::new());
/// let prices = Arc::new(PriceTable::from_json(r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#).unwrap());
/// let upstream = service_fn(|_: Request<Full<Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
/// });
///
/// // CreditGuard reads the principal: without BearerAuth the stack is refused.
/// let missing = CheckedStack::new()
///     .plain(ErrorMapperLayer::new())
///     .layer(BodyLimitLayer::new())
///     .layer(CreditGuardLayer::new(store.clone(), prices.clone()))
///     .service(upstream.clone())
///     .unwrap_err();
/// assert_eq!(missing.layer, "CreditGuard");
/// assert_eq!(missing.to_string(), "CreditGuard reads the caller's principal, which no layer before it adds: stack BearerAuth outside it");
///
/// let checked = CheckedStack::new()
///     .plain(ErrorMapperLayer::new())
///     .layer(BearerAuthLayer::new(KeyDirectory::new(store.clone())))
///     .layer(BodyLimitLayer::new())
///     .layer(CreditGuardLayer::new(store, prices))
///     .service(upstream);
/// assert!(checked.is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct CheckedStack<L> {
    builder: ServiceBuilder<L>,
    added: Vec<ContextPart>,
    missing: Option<MissingLayer>,
}

impl Default for CheckedStack<Identity> {
    fn default() -> Self {
        Self::new()
    }
}

impl CheckedStack<Identity> {
    /// An empty stack.
    pub fn new() -> Self {
        CheckedStack {
            builder: ServiceBuilder::new(),
            added: Vec::new(),
            missing: None,
        }
    }
}

impl<L> CheckedStack<L> {
    /// Adds `layer` inside the layers added so far, checking what it reads.
    pub fn layer<T: ContextLayer>(mut self, layer: T) -> CheckedStack<Stack<T, L>> {
        if self.missing.is_none() {
            self.missing = layer
                .reads()
                .iter()
                .find(|part| !self.added.contains(part))
                .map(|&part| MissingLayer {
                    layer: T::NAME,
                    part,
                });
        }
        self.added.extend_from_slice(layer.adds());
        CheckedStack {
            builder: self.builder.layer(layer),
            added: self.added,
            missing: self.missing,
        }
    }

    /// Adds `layer`, which neither reads nor adds a part of the context.
    pub fn plain<T>(self, layer: T) -> CheckedStack<Stack<T, L>> {
        CheckedStack {
            builder: self.builder.layer(layer),
            added: self.added,
            missing: self.missing,
        }
    }

    /// The checked stack as one layer, to put around a route of one's own
    /// (axum's `route_layer` or `MethodRouter::layer`, tower's
    /// `ServiceBuilder::layer`); or the first layer whose reading no layer
    /// outside it adds.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::{Router, routing::{get, post}};
    /// use modelgate::auth::BearerAuthLayer;
    /// use modelgate::body::BodyLimitLayer;
    /// use modelgate::context::CheckedStack;
    /// use modelgate::error_mapper::ErrorMapperLayer;
    /// use modelgate::keys::{KeyDirectory, SharedStore};
    /// use modelgate::store::MemoryStore;
    ///
    /// let store: SharedStore = Arc::new(MemoryStore::new());
    /// let gate = CheckedStack::new()
    ///     .plain(ErrorMapperLayer::new())
    ///     .layer(BearerAuthLayer::new(KeyDirectory::new(store)))
    ///     .layer(BodyLimitLayer::new())
    ///     .into_layer()
    ///     .expect("every part read is added outside its reader");
    /// // The gate on the chat route only: `/hello` is the service's own.
    /// let app: Router = Router::new()
    ///     .route("/hello", get(|| async { "hello" }))
    ///     .route("/v1/chat/completions", post(|| async { "{}" }).route_layer(gate));
    /// # let _ = app;
    /// ```
    pub fn into_layer(self) -> Result<L, MissingLayer> {
        match self.missing {
            Some(missing) => Err(missing),
            None => Ok(self.builder.into_inner()),
        }
    }

    /// The stack around `service`, or the first layer whose reading no
    /// layer outside it adds.
    pub fn service<S>(self, service: S) -> Result<L::Service, MissingLayer>
    where
        L: Layer<S>,
    {
        match self.missing {
            Some(missing) => Err(missing),
            None => Ok(self.builder.service(service)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Adds(&'static [ContextPart]);
    struct Reads(&'static [ContextPart]);

    impl ContextLayer for Adds {
        const NAME: &'static str = "Adds";
        fn adds(&self) -> &'static [ContextPart] {
            self.0
        }
    }

    impl ContextLayer for Reads {
        const NAME: &'static str = "Reads";
        fn reads(&self) -> &'static [ContextPart] {
            self.0
        }
    }

    impl<S> Layer<S> for Adds {
        type Service = S;
        fn layer(&self, inner: S) -> S {
            inner
        }
    }

    impl<S> Layer<S> for Reads {
        type Service = S;
        fn layer(&self, inner: S) -> S {
            inner
        }
    }

    const BOTH: &[ContextPart] = &[ContextPart::Principal, ContextPart::ParsedBody];

    #[test]
    fn a_part_must_be_added_outside_the_layer_that_reads_it() {
        let inside_out = CheckedStack::new()
            .layer(Reads(BOTH))
            .layer(Adds(BOTH))
            .service(());
        assert_eq!(
            inside_out,
            Err(MissingLayer {
                layer: "Reads",
                part: ContextPart::Principal
            })
        );
        let half = CheckedStack::new()
            .layer(Adds(&[ContextPart::Principal]))
            .plain(Identity::new())
            .layer(Reads(BOTH))
            .service(());
        assert_eq!(
            half.unwrap_err().part,
            ContextPart::ParsedBody,
            "each part is checked"
        );
        let first_error_kept = CheckedStack::new()
            .layer(Reads(&[ContextPart::ParsedBody]))
            .layer(Reads(&[ContextPart::Principal]))
            .service(());
        assert_eq!(first_error_kept.unwrap_err().part, ContextPart::ParsedBody);
        let as_layer = CheckedStack::new()
            .layer(Reads(&[ContextPart::Principal]))
            .layer(Adds(&[ContextPart::Principal]))
            .into_layer();
        assert_eq!(as_layer.err().map(|missing| missing.layer), Some("Reads"));
        assert!(
            CheckedStack::new()
                .layer(Adds(&[ContextPart::Principal]))
                .layer(Adds(&[ContextPart::ParsedBody]))
                .layer(Reads(BOTH))
                .service(())
                .is_ok()
        );
    }
}
