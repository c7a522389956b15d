use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::layer::KeyRoutesConfig;
use super::routes::{Request as ApiRequest, dispatch, match_path};
use crate::answer::AnswerFuture as ResponseFuture;
use crate::context::RequestContext;
use crate::keys::input;
use crate::response_body::ResponseBody;

/// Answers the JSON API (the table in the [module docs](super)): the key
/// management API (`/api/v1/keys…`,
/// `/api/v1/accounts/{id}/credits`, management keys only), the accounts'
/// own provider keys (`/api/v1/accounts/{id}/byok…`: set and deleted by
/// management keys, listed by them and the keys of that account) and the
/// queries of the calling key
/// (`GET /api/v1/key`, `GET /api/v1/credits`, `GET /user/balance`); every
/// other request goes to the inner service untouched.
///
/// Runs after [`BearerAuth`](crate::auth::BearerAuth) (it reads the
/// principal) and after [`BodyLimit`](crate::body::BodyLimit) (it reads
/// the body's bytes), both from the request's
/// [`RequestContext`](crate::context::RequestContext); without them its endpoints answer 500 naming the
/// missing layer. See the [module docs](super) for an example.
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct KeyRoutes<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<KeyRoutesConfig>,
}

impl<S, B, ResBody> Service<Request<B>> for KeyRoutes<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // A model call (BodyLimit parsed it) is none of the table's
        // routes: passed on without reading its path again.
        let context = RequestContext::of(&request);
        if context.is_some_and(|context| context.model_call().is_some()) {
            return ResponseFuture::passing(self.inner.call(request));
        }
        let Some(matched) = match_path(request.uri().path()) else {
            return ResponseFuture::passing(self.inner.call(request));
        };
        let api_request = ApiRequest {
            method: request.method().clone(),
            query: request.uri().query().map(str::to_owned),
            principal: context.and_then(|context| context.principal.clone()),
            idempotency_keys: request
                .headers()
                .get_all(input::IDEMPOTENCY_KEY_HEADER)
                .iter()
                .cloned()
                .collect(),
            body: context.and_then(|context| context.body.clone()),
        };
        let config = Arc::clone(&self.config);
        ResponseFuture::answering(Box::pin(async move {
            match dispatch(config, matched, api_request).await {
                Ok(answer) => answer.into_response(),
                Err(error) => error.to_response(),
            }
        }))
    }
}
