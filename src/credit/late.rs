//! Late answers: a request the upstream had but did not answer in time (or
//! whose connection failed) is settled on what the upstream still answers,
//! read in the background after its client got its error.

use std::pin::pin;

use futures_util::future::{Either, select};
use http_body_util::BodyExt;

use super::body::MeteredBody;
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
        let tracked = self.pending.track(&Settlement {
            account: self.account.clone(),
            key: self.key.clone(),
            reservation_id: self.reservation_id.clone(),
            hold_granted: self.hold_granted,
            cost_nanos: self.estimate_nanos,
            byok: self.byok,
            record: None,
        });
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
            let event_stream = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.split(';').next())
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"));
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
            let mut body =
                MeteredBody::metered(body, self, UsageScanner::new(kind, max_scanned_body_bytes));
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
