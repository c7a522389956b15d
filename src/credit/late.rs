//! Late answers: a request the upstream had but did not answer in time (or
//! whose connection failed) is settled on what the upstream still answers,
//! read in the background after its client got its error.

use std::pin::pin;
use std::sync::Arc;

use futures_util::future::{Either, select};
use http_body_util::BodyExt;

use super::body::MeteredBody;
use super::future::content_type_is;
use super::meter::{Ending, Meter};
use super::usage::{BodyKind, UsageScanner};
use crate::context::LateAnswer;
use crate::store::Settlement;

impl Meter {
    /// Settles on `late`: a lost answer at once, for the hold; a coming
    /// one once it has been read (its usage, basis `late_answer`) or its
    /// deadline passed, its connection failed, or the gateway ended its
    /// streams (the hold, basis `unanswered`). Pending until recorded, so
    /// a gateway that stops waits for it.
    pub(crate) fn settle_late(mut self, late: LateAnswer, max_scanned_body_bytes: usize) {
        self.late = true;
        let LateAnswer::Coming {
            deadline,
            response,
            permit,
        } = late
        else {
            self.settle_in_background(None, Ending::Unanswered);
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.settle_in_background(None, Ending::Unanswered);
            return;
        };
        // What it costs should nothing more be known: a stopping gateway
        // names it among those pending.
        let tracked = self.pending.track(Arc::new(Settlement {
            account: self.account.clone(),
            key: self.key.clone(),
            reservation_id: self.reservation_id.clone(),
            hold_granted: self.hold_granted,
            cost_nanos: self.estimate_nanos,
            byok: self.byok,
            record: None,
        }));
        let streams_end = self.pending.streams_end();
        runtime.spawn(async move {
            let _permit = permit;
            let coming = pin!(tokio::time::timeout_at(deadline, response));
            let response = match select(coming, streams_end).await {
                Either::Left((Ok(Some(response)), _)) => response,
                // No answer by the deadline, a failed connection, or a
                // gateway stopping: what was used is unknown.
                _ => {
                    self.settle_in_background(None, Ending::Unanswered);
                    return;
                }
            };
            let (parts, body) = response.into_parts();
            let event_stream = content_type_is(&parts.headers, "text/event-stream");
            self.response_success = Some(parts.status.is_success());
            if let Some(generation) = &mut self.generation {
                generation.status = Some(parts.status.as_u16());
                generation.streamed = event_stream;
            }
            let kind = match event_stream {
                true => BodyKind::EventStream,
                false => BodyKind::Json,
            };
            // Read as a response the client reads is, through the same
            // scanner; it settles at its end, when it fails, when the
            // gateway ends it, or when dropped at the deadline.
            let scanner = UsageScanner::new(kind, max_scanned_body_bytes).in_api(self.api);
            let mut body = MeteredBody::metered(body, self, scanner);
            let _ = tokio::time::timeout_at(deadline, async {
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        return;
                    }
                }
            })
            .await;
            drop(body);
            // Its settlement is tracked by now.
            drop(tracked);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::clock::{Clock, SystemClock};
    use crate::credit::PendingSettlements;
    use crate::credit::group_commit::GroupCommit;
    use crate::credit::pricing::TokenPrice;
    use crate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT};

    const HOLD_NANOS: i64 = 100 * NANOS_PER_CREDIT;

    /// A meter held for 100 credits, at a credit a token.
    fn meter(store: &Arc<MemoryStore>, pending: &PendingSettlements) -> Meter {
        Meter {
            api: crate::context::ModelApi::Chat,
            ledger: GroupCommit::new(store.clone(), Arc::new(SystemClock)),
            account: "acme".into(),
            key: "0123456789abcdef".into(),
            reservation_id: "r1".into(),
            hold_granted: false,
            estimate_nanos: HOLD_NANOS,
            price: Arc::new(TokenPrice::per_million_tokens(
                NANOS_PER_CREDIT * 1_000_000,
                NANOS_PER_CREDIT * 1_000_000,
            )),
            free: false,
            byok: false,
            response_success: None,
            late: false,
            prompt_tokens: 5,
            streamed_tokens: None,
            pending: pending.clone(),
            renewal: None,
            generation: None,
            span: tracing::Span::none(),
            key_limit: None,
            on_settled: None,
        }
    }

    async fn charged_nanos(store: &MemoryStore) -> i64 {
        store
            .key_usage("acme", "0123456789abcdef", SystemClock.now())
            .await
            .unwrap()
            .total_nanos
    }

    fn answer(body: &'static str, content_type: &str) -> http::Response<crate::context::LateBody> {
        http::Response::builder()
            .header("content-type", content_type)
            .body(
                Full::new(Bytes::from_static(body.as_bytes()))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .unwrap()
    }

    fn coming(
        after: Duration,
        response: Option<http::Response<crate::context::LateBody>>,
        wait: Duration,
    ) -> LateAnswer {
        LateAnswer::Coming {
            deadline: tokio::time::Instant::now() + wait,
            response: Box::pin(async move {
                tokio::time::sleep(after).await;
                response
            }),
            permit: None,
        }
    }

    /// Lets the runtime run the tasks (paused time advances when idle).
    async fn settle(pending: &PendingSettlements) {
        assert!(pending.settled_within(Duration::from_secs(7200)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answers_usage_is_charged_json_or_stream() {
        for (body, content_type, tokens) in [
            (
                r#"{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}}"#,
                "application/json",
                10,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
                "text/event-stream",
                5,
            ),
        ] {
            let store = Arc::new(MemoryStore::new());
            let pending = PendingSettlements::default();
            let late = coming(
                Duration::from_secs(30),
                Some(answer(body, content_type)),
                Duration::from_secs(600),
            );
            meter(&store, &pending).settle_late(late, 64 * 1024);
            assert_eq!(pending.len(), 1, "pending while the answer is awaited");
            settle(&pending).await;
            assert_eq!(charged_nanos(&store).await, tokens * NANOS_PER_CREDIT);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_by_the_deadline_a_failed_connection_or_a_lost_one_is_charged_the_hold() {
        for late in [
            coming(Duration::from_secs(3600), None, Duration::from_secs(600)),
            coming(Duration::from_secs(1), None, Duration::from_secs(600)),
            LateAnswer::Lost,
        ] {
            let store = Arc::new(MemoryStore::new());
            let pending = PendingSettlements::default();
            meter(&store, &pending).settle_late(late, 64 * 1024);
            settle(&pending).await;
            assert_eq!(charged_nanos(&store).await, HOLD_NANOS);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_error_answer_without_usage_is_charged_nothing() {
        let store = Arc::new(MemoryStore::new());
        let pending = PendingSettlements::default();
        let mut failed = answer(
            r#"{"error": {"message": "overloaded"}}"#,
            "application/json",
        );
        *failed.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        let late = coming(
            Duration::from_secs(1),
            Some(failed),
            Duration::from_secs(600),
        );
        meter(&store, &pending).settle_late(late, 64 * 1024);
        settle(&pending).await;
        assert_eq!(charged_nanos(&store).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gateway_stopping_gives_up_a_late_answer_and_charges_the_hold() {
        let store = Arc::new(MemoryStore::new());
        let pending = PendingSettlements::default();
        let late = coming(Duration::from_secs(3600), None, Duration::from_secs(7200));
        meter(&store, &pending).settle_late(late, 64 * 1024);
        assert!(
            !pending.settled_within(Duration::from_secs(60)).await,
            "awaited while the gateway runs"
        );
        assert_eq!(charged_nanos(&store).await, 0);
        pending.end_streams();
        assert!(pending.settled_within(Duration::from_secs(1)).await);
        assert_eq!(charged_nanos(&store).await, HOLD_NANOS);
    }
}
