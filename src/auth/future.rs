/// Response future of [`BearerAuth`](super::BearerAuth): the key lookup,
/// then the inner service.
pub type ResponseFuture<S, B> = crate::limiter::AdmissionFuture<S, B, super::Principal>;
