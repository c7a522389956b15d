//! Authorization codes: made when a person approves an app, kept only as
//! their SHA-256 in the store's `auth_codes` records for
//! [`CODE_LIFETIME`], exchanged once for a key.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::input::ExchangeRequest;
use super::pkce::{ChallengeMethod, verifier_matches};
use crate::auth::ApiKey;
use crate::clock::Period;
use crate::keys::{KeyDirectory, KeyRecord, MAX_KEY_NAME_CHARS, NewKey};
use crate::store::{Expect, PutOptions, PutOutcome, RecordStoreExt, StoreError, WriteOutcome};

/// The record collection of authorization codes, by the hex SHA-256 of
/// the code.
pub const AUTH_CODES: &str = "auth_codes";

/// How long a code may wait for its exchange: RFC 6749 asks for a short
/// life, at most ten minutes.
pub const CODE_LIFETIME: Duration = Duration::from_secs(600);

/// The most codes waiting for their exchange at once, over every account.
/// A bound on what a leaked management key can make the store hold; past
/// it, new approvals are refused (503) until codes are used or expire.
pub const MAX_PENDING_CODES: u64 = 100_000;

/// The most codes one account may have waiting for their exchange, unless
/// configured otherwise ([`AuthCodes::max_pending_per_account`]): one
/// account cannot take the gateway-wide [`MAX_PENDING_CODES`] from the
/// others. People approve apps one click at a time; 100 in ten minutes is
/// far more than any of them needs.
pub const DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT: u64 = 100;

/// The record collection of `account`'s codes waiting for their exchange,
/// by the same id as in [`AUTH_CODES`]: each holds the code's place in
/// the account's cap until it is exchanged or expires.
pub fn pending_codes(account: &str) -> String {
    format!("{AUTH_CODES}/{account}")
}

/// An authorization code: 256 random bits as 43 base64url characters.
///
/// `Debug` hides it; [`expose`](Self::expose) gives the text.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthCode(String);

impl AuthCode {
    /// The length of a code, in characters.
    pub const LEN: usize = 43;

    /// A new code from the operating system's CSPRNG.
    pub fn generate() -> AuthCode {
        let mut bytes = [0u8; 32];
        crate::random::fill(&mut bytes);
        AuthCode(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// `text` when it has a code's shape (43 base64url characters, no
    /// stray bits): anything else is no code of this gateway, known
    /// without asking the store.
    pub fn parse(text: &str) -> Option<AuthCode> {
        if text.len() != Self::LEN {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        (bytes.len() == 32).then(|| AuthCode(text.to_owned()))
    }

    /// The code's text, to hand to the browser once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The code's id in [`AUTH_CODES`]: the hex SHA-256 of its text, so the
    /// store never holds a code that could be exchanged.
    pub fn hash_hex(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

impl fmt::Debug for AuthCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthCode(…)")
    }
}

/// What a person approved for an app: the key it will get and the PKCE
/// challenge that binds the code to the app that asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The account the key will belong to.
    pub account: String,
    /// The key's name.
    pub key_name: String,
    /// The key's credit limit in nano-credits; `None`: no limit.
    pub limit_nanos: Option<i64>,
    /// When the limit starts again; `None`: never.
    pub limit_reset: Option<Period>,
    /// When the key stops working; `None`: never.
    pub key_expires_at: Option<DateTime<Utc>>,
    /// Where the code was sent.
    pub callback_url: String,
    /// The app's challenge.
    pub code_challenge: String,
    /// How the challenge was made.
    pub code_challenge_method: ChallengeMethod,
}

/// A code as stored: the approval, its lifetime, and whether it was used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct StoredCode {
    approval: Approval,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    /// Set by the one exchange that took the code; kept until the code
    /// would have expired, so a second exchange is told it was used.
    #[serde(default)]
    used_at: Option<DateTime<Utc>>,
}

/// A code made by [`AuthCodes::issue`].
#[derive(Debug)]
pub struct IssuedCode {
    /// The code, for the browser to carry back to the app.
    pub code: AuthCode,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it can no longer be exchanged.
    pub expires_at: DateTime<Utc>,
}

/// Why no code was made.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// [`MAX_PENDING_CODES`] codes are waiting already.
    #[error("{MAX_PENDING_CODES} authorization codes are waiting for their exchange already")]
    TooManyPending,
    /// The account has as many codes waiting as it may
    /// ([`AuthCodes::max_pending_per_account`]).
    #[error("the account has {most} authorization codes waiting for their exchange already")]
    TooManyPendingForAccount {
        /// The account's cap.
        most: u64,
        /// When its oldest waiting code expires, freeing a place.
        retry_after: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why an exchange gave no key. Each is a 403 to the app; the reasons are
/// as specific as is safe, since whoever asks holds a code already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeRefusal {
    /// No such code: malformed, never made, or expired.
    InvalidCode,
    /// The code was exchanged already.
    CodeUsed,
    /// `code_challenge_method` is not the method the code was made with.
    MethodMismatch,
    /// The verifier does not answer the code's challenge.
    VerifierMismatch,
}

impl ExchangeRefusal {
    /// Its `metadata.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            ExchangeRefusal::InvalidCode => "invalid_code",
            ExchangeRefusal::CodeUsed => "code_used",
            ExchangeRefusal::MethodMismatch => "method_mismatch",
            ExchangeRefusal::VerifierMismatch => "verifier_mismatch",
        }
    }

    /// What the app is told.
    pub fn message(self) -> &'static str {
        match self {
            ExchangeRefusal::InvalidCode => {
                "this authorization code is not valid: it is unknown or expired (codes last 10 minutes); send the person through /auth again"
            }
            ExchangeRefusal::CodeUsed => {
                "this authorization code was exchanged already; a code gives one key. Send the person through /auth again"
            }
            ExchangeRefusal::MethodMismatch => {
                "code_challenge_method is not the method the code's challenge was made with"
            }
            ExchangeRefusal::VerifierMismatch => {
                "code_verifier does not match the code's challenge; send the verifier whose challenge went to /auth"
            }
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Refused: see [`ExchangeRefusal`].
    #[error("{}", .0.message())]
    Refused(ExchangeRefusal),
    /// The store failed; the code may be spent (when the failure came after
    /// it was taken), and the app starts again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The authorization codes of a [`KeyDirectory`]'s store, at its clock.
#[derive(Clone, Debug)]
pub struct AuthCodes {
    directory: KeyDirectory,
    max_pending_per_account: u64,
}

/// A code's place in its account's cap, in [`pending_codes`]: when it
/// expires, so a refusal can say when a place frees.
#[derive(Serialize, Deserialize)]
struct PendingPlace {
    expires_at: DateTime<Utc>,
}

impl AuthCodes {
    /// Codes kept in `directory`'s store, for keys of `directory`, at most
    /// [`DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT`] waiting per account.
    pub fn new(directory: KeyDirectory) -> Self {
        AuthCodes {
            directory,
            max_pending_per_account: DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT,
        }
    }

    /// At most `most` codes (at least 1) of one account wait for their
    /// exchange at once; past it, [`issue`](Self::issue) is refused until
    /// one is exchanged or expires. Decided by the store in one atomic
    /// write, so it holds under concurrency and across instances.
    pub fn max_pending_per_account(mut self, most: u64) -> Self {
        self.max_pending_per_account = most.max(1);
        self
    }

    /// Makes a code for `approval`, valid for [`CODE_LIFETIME`]. Nothing is
    /// created in the account until the code is exchanged.
    ///
    /// The code first takes a place among its account's waiting codes
    /// ([`pending_codes`], capped per account), then is written among all
    /// codes ([`AUTH_CODES`], capped at [`MAX_PENDING_CODES`]); a place
    /// taken for a code that was then not written is given back (or, if
    /// the store fails meanwhile, frees itself when the code would have
    /// expired).
    pub async fn issue(&self, approval: Approval) -> Result<IssuedCode, IssueError> {
        let now = self.directory.now();
        let expires_at = now + CODE_LIFETIME;
        let account = approval.account.clone();
        let stored = StoredCode {
            approval,
            created_at: now,
            expires_at,
            used_at: None,
        };
        // 256 random bits do not collide; a conflict means a broken random
        // source, tried once more all the same.
        for _ in 0..2 {
            let code = AuthCode::generate();
            let id = code.hash_hex();
            if !self.take_place(&account, &id, expires_at, now).await? {
                continue;
            }
            let written = self
                .directory
                .store()
                .put_json_at(
                    AUTH_CODES,
                    &id,
                    &stored,
                    Expect::Absent,
                    PutOptions::expiring(CODE_LIFETIME).max_records(MAX_PENDING_CODES),
                    now,
                )
                .await;
            match written {
                Ok(PutOutcome::Write(WriteOutcome::Written { .. })) => {
                    return Ok(IssuedCode {
                        code,
                        created_at: now,
                        expires_at,
                    });
                }
                Ok(PutOutcome::Write(WriteOutcome::Conflict { .. })) => {
                    self.give_back_place(&account, &id, now).await;
                }
                Ok(PutOutcome::Full { .. }) => {
                    self.give_back_place(&account, &id, now).await;
                    return Err(IssueError::TooManyPending);
                }
                Err(error) => {
                    self.give_back_place(&account, &id, now).await;
                    return Err(error.into());
                }
            }
        }
        Err(StoreError::corrupt("put_record", "every new authorization code collided").into())
    }

    /// Takes a place for code `id` among `account`'s waiting codes: false
    /// when the id has one already (a collision), an error when the
    /// account has no place left.
    async fn take_place(
        &self,
        account: &str,
        id: &str,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, IssueError> {
        let store = self.directory.store();
        let collection = pending_codes(account);
        let options = PutOptions::expiring(CODE_LIFETIME).max_records(self.max_pending_per_account);
        match store
            .put_json_at(
                &collection,
                id,
                &PendingPlace { expires_at },
                Expect::Absent,
                options,
                now,
            )
            .await?
        {
            PutOutcome::Write(WriteOutcome::Written { .. }) => Ok(true),
            PutOutcome::Write(WriteOutcome::Conflict { .. }) => Ok(false),
            PutOutcome::Full { records } => {
                // All places share one lifetime, so the oldest (the last
                // listed, newest first) frees first. A failed read only
                // costs the precision of the wait.
                let oldest = store
                    .list_records_at(&collection, records.saturating_sub(1) as usize, 1, now)
                    .await
                    .ok()
                    .and_then(|listed| listed.into_iter().next())
                    .and_then(|(_, place)| {
                        serde_json::from_slice::<PendingPlace>(&place.value).ok()
                    });
                let retry_after = oldest
                    .and_then(|place| (place.expires_at - now).to_std().ok())
                    .unwrap_or(CODE_LIFETIME)
                    .clamp(Duration::from_secs(1), CODE_LIFETIME);
                Err(IssueError::TooManyPendingForAccount {
                    most: self.max_pending_per_account,
                    retry_after,
                })
            }
        }
    }

    /// Frees code `id`'s place among `account`'s waiting codes: it was
    /// exchanged, or never written. A failure is logged; the place frees
    /// itself when the code would have expired.
    async fn give_back_place(&self, account: &str, id: &str, now: DateTime<Utc>) {
        if let Err(error) = self
            .directory
            .store()
            .delete_record_at(&pending_codes(account), id, Expect::Any, now)
            .await
        {
            tracing::warn!(
                %account,
                %error,
                "an authorization code's place in its account's cap was not freed; it frees itself within 10 minutes"
            );
        }
    }

    /// Exchanges `request`'s code for a new key of the approved account,
    /// once: the code is marked used by a compare-and-set write on its
    /// revision before the key is made, so of two exchanges racing for
    /// one code (on any instances sharing the store) exactly one gets a
    /// key. A refused exchange changes nothing: a wrong verifier does not
    /// spend the code.
    ///
    /// Returns the key's plaintext (shown to the app once) and its record.
    pub async fn exchange(
        &self,
        request: &ExchangeRequest,
    ) -> Result<(ApiKey, KeyRecord), ExchangeError> {
        let refused = |refusal| Err(ExchangeError::Refused(refusal));
        // A string with no code's shape is no code: no store round trip.
        let Some(code) = AuthCode::parse(&request.code) else {
            return refused(ExchangeRefusal::InvalidCode);
        };
        let id = code.hash_hex();
        let store = self.directory.store();
        let now = self.directory.now();
        let Some(found) = store
            .get_json_at::<StoredCode>(AUTH_CODES, &id, now)
            .await?
        else {
            return refused(ExchangeRefusal::InvalidCode);
        };
        let stored = found.value;
        // The store forgets a code by its own clock (Redis's on Redis); the
        // gateway's clock decides too, so neither lets a code live longer.
        if stored.expires_at <= now {
            return refused(ExchangeRefusal::InvalidCode);
        }
        if stored.used_at.is_some() {
            return refused(ExchangeRefusal::CodeUsed);
        }
        let approval = &stored.approval;
        if request
            .code_challenge_method
            .is_some_and(|method| method != approval.code_challenge_method)
        {
            return refused(ExchangeRefusal::MethodMismatch);
        }
        if !verifier_matches(
            approval.code_challenge_method,
            &approval.code_challenge,
            &request.code_verifier,
        ) {
            return refused(ExchangeRefusal::VerifierMismatch);
        }
        // Taken: written used at the revision just read. Another exchange
        // that read the same revision finds it changed and is refused.
        let left = (stored.expires_at - now)
            .to_std()
            .unwrap_or_default()
            .max(Duration::from_secs(1));
        let used = StoredCode {
            used_at: Some(now),
            ..stored.clone()
        };
        match store
            .put_json_at(
                AUTH_CODES,
                &id,
                &used,
                Expect::Revision(found.revision),
                PutOptions::expiring(left),
                now,
            )
            .await?
            .uncapped()?
        {
            WriteOutcome::Written { .. } => {}
            WriteOutcome::Conflict { current: Some(_) } => {
                return refused(ExchangeRefusal::CodeUsed);
            }
            // Expired between the read and the write.
            WriteOutcome::Conflict { current: None } => {
                return refused(ExchangeRefusal::InvalidCode);
            }
        }
        // No longer waiting: its place in the account's cap is free.
        self.give_back_place(&stored.approval.account, &id, now)
            .await;
        let approval = used.approval;
        let new = NewKey {
            account: approval.account.clone(),
            limit_nanos: approval.limit_nanos,
            limit_reset: approval.limit_reset,
            expires_at: approval.key_expires_at,
            ..NewKey::named(approval.key_name.clone())
        };
        self.directory.create_key(new).await.map_err(|error| {
            // The code is spent and no key was made: the app must send the
            // person through the consent page again. Said in the log, as
            // the app only sees a 503.
            tracing::error!(
                account = %approval.account,
                app = %approval.callback_url,
                %error,
                "an authorization code was taken but its key could not be created; the app must ask again"
            );
            ExchangeError::Store(error)
        })
    }
}

/// The name of an app's key: the approval's label, else the callback URL's
/// host, cut to [`MAX_KEY_NAME_CHARS`].
pub(crate) fn app_key_name(label: Option<&str>, host: &str) -> String {
    label
        .unwrap_or(host)
        .chars()
        .take(MAX_KEY_NAME_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::keys::{KeyState, SharedStore};
    use crate::oauth::pkce::s256_challenge;
    use crate::store::MemoryStore;
    use chrono::TimeZone;
    use std::sync::Arc;

    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

    fn setup() -> (AuthCodes, Arc<ManualClock>, SharedStore) {
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap(),
        ));
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store.clone())
            .clock(clock.clone())
            .build();
        (AuthCodes::new(directory), clock, store)
    }

    fn approval(method: ChallengeMethod) -> Approval {
        Approval {
            account: "acme".into(),
            key_name: "app.example.com".into(),
            limit_nanos: Some(5_000_000_000),
            limit_reset: Some(Period::Day),
            key_expires_at: None,
            callback_url: "https://app.example.com/cb".into(),
            code_challenge: match method {
                ChallengeMethod::S256 => s256_challenge(VERIFIER),
                ChallengeMethod::Plain => VERIFIER.into(),
            },
            code_challenge_method: method,
        }
    }

    fn exchange_of(code: &str, verifier: &str, method: Option<ChallengeMethod>) -> ExchangeRequest {
        ExchangeRequest {
            code: code.into(),
            code_verifier: verifier.into(),
            code_challenge_method: method,
        }
    }

    fn refusal(result: Result<(ApiKey, KeyRecord), ExchangeError>) -> ExchangeRefusal {
        match result {
            Err(ExchangeError::Refused(refusal)) => refusal,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn codes_are_256_random_bits_in_base64url() {
        let code = AuthCode::generate();
        assert_eq!(code.expose().len(), AuthCode::LEN);
        assert_eq!(AuthCode::parse(code.expose()), Some(code.clone()));
        assert_ne!(AuthCode::generate(), code);
        assert_eq!(code.hash_hex().len(), 64);
        assert!(!format!("{code:?}").contains(code.expose()));
        for bad in [
            "",
            "abc",
            &"A".repeat(44),
            &format!("{}=", &"A".repeat(42)),
            &"+".repeat(43),
        ] {
            assert_eq!(AuthCode::parse(bad), None, "{bad}");
        }
        // 43 characters carry 258 bits: the last two must be zero.
        assert_eq!(AuthCode::parse(&format!("{}B", "A".repeat(42))), None);
    }

    #[tokio::test]
    async fn a_code_gives_one_key_with_what_was_approved() {
        let (codes, clock, store) = setup();
        let issued = codes.issue(approval(ChallengeMethod::S256)).await.unwrap();
        // Only the hash is stored.
        let listed = store
            .list_records_at(AUTH_CODES, 0, 10, clock.now())
            .await
            .unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, issued.code.hash_hex());
        assert!(!String::from_utf8_lossy(&listed[0].1.value).contains(issued.code.expose()));

        let (key, record) = codes
            .exchange(&exchange_of(
                issued.code.expose(),
                VERIFIER,
                Some(ChallengeMethod::S256),
            ))
            .await
            .unwrap();
        assert_eq!(record.account, "acme");
        assert_eq!(record.name, "app.example.com");
        assert_eq!(record.limit_nanos, Some(5_000_000_000));
        assert_eq!(record.limit_reset, Some(Period::Day));
        assert!(!record.management);
        assert!(matches!(
            codes.directory.lookup(&key.hash()).await.unwrap(),
            KeyState::Active(_)
        ));
        let again = codes
            .exchange(&exchange_of(issued.code.expose(), VERIFIER, None))
            .await;
        assert_eq!(refusal(again), ExchangeRefusal::CodeUsed);
    }

    #[tokio::test]
    async fn refusals_change_nothing_and_say_why() {
        let (codes, clock, _) = setup();
        let issued = codes.issue(approval(ChallengeMethod::S256)).await.unwrap();
        let code = issued.code.expose();
        let wrong = "x".repeat(43);
        assert_eq!(
            refusal(codes.exchange(&exchange_of(code, &wrong, None)).await),
            ExchangeRefusal::VerifierMismatch
        );
        assert_eq!(
            refusal(
                codes
                    .exchange(&exchange_of(code, VERIFIER, Some(ChallengeMethod::Plain)))
                    .await
            ),
            ExchangeRefusal::MethodMismatch
        );
        // The plain challenge is the S256 one: sending it back as the
        // verifier does not pass either.
        assert_eq!(
            refusal(
                codes
                    .exchange(&exchange_of(code, &s256_challenge(VERIFIER), None))
                    .await
            ),
            ExchangeRefusal::VerifierMismatch
        );
        for unknown in ["nope", AuthCode::generate().expose()] {
            assert_eq!(
                refusal(codes.exchange(&exchange_of(unknown, VERIFIER, None)).await),
                ExchangeRefusal::InvalidCode
            );
        }
        // None of that spent the code; time does.
        clock.advance(CODE_LIFETIME - Duration::from_secs(1));
        let plain = codes.issue(approval(ChallengeMethod::Plain)).await.unwrap();
        codes
            .exchange(&exchange_of(code, VERIFIER, None))
            .await
            .unwrap();
        clock.advance(CODE_LIFETIME);
        assert_eq!(
            refusal(
                codes
                    .exchange(&exchange_of(plain.code.expose(), VERIFIER, None))
                    .await
            ),
            ExchangeRefusal::InvalidCode
        );
    }

    #[tokio::test]
    async fn concurrent_exchanges_of_one_code_give_one_key() {
        let (codes, _, _) = setup();
        let issued = codes.issue(approval(ChallengeMethod::Plain)).await.unwrap();
        let request = exchange_of(issued.code.expose(), VERIFIER, Some(ChallengeMethod::Plain));
        let results =
            futures_util::future::join_all((0..16).map(|_| codes.exchange(&request))).await;
        let keys = results.iter().filter(|result| result.is_ok()).count();
        assert_eq!(keys, 1);
        for result in results {
            if let Err(error) = result {
                assert!(matches!(
                    error,
                    ExchangeError::Refused(ExchangeRefusal::CodeUsed)
                ));
            }
        }
    }

    #[tokio::test]
    async fn an_account_has_its_own_cap_on_waiting_codes_and_an_exchange_frees_a_place() {
        let (codes, clock, store) = setup();
        let codes = codes.max_pending_per_account(3);
        let mut issued = Vec::new();
        for _ in 0..3 {
            issued.push(codes.issue(approval(ChallengeMethod::S256)).await.unwrap());
            clock.advance(Duration::from_secs(60));
        }
        // Full: the wait is until the oldest expires (10 min after it was
        // made, 3 min ago).
        match codes.issue(approval(ChallengeMethod::S256)).await {
            Err(IssueError::TooManyPendingForAccount { most, retry_after }) => {
                assert_eq!(most, 3);
                assert_eq!(retry_after, CODE_LIFETIME - Duration::from_secs(180));
            }
            other => panic!("not refused: {other:?}"),
        }
        // Nothing of the refused one was kept.
        let all = store
            .list_records_at(AUTH_CODES, 0, 10, clock.now())
            .await
            .unwrap();
        assert_eq!(all.len(), 3);
        // Another account is not affected.
        let other = Approval {
            account: "globex".into(),
            ..approval(ChallengeMethod::S256)
        };
        codes.issue(other).await.unwrap();
        // An exchanged code no longer waits: its place is free at once.
        codes
            .exchange(&exchange_of(issued[0].code.expose(), VERIFIER, None))
            .await
            .unwrap();
        codes.issue(approval(ChallengeMethod::S256)).await.unwrap();
        assert!(matches!(
            codes.issue(approval(ChallengeMethod::S256)).await,
            Err(IssueError::TooManyPendingForAccount { .. })
        ));
        // And an expired one frees its place by itself.
        clock.advance(CODE_LIFETIME - Duration::from_secs(119));
        codes.issue(approval(ChallengeMethod::S256)).await.unwrap();
    }

    #[tokio::test]
    async fn concurrent_issues_never_pass_the_account_s_cap() {
        let (codes, _, _) = setup();
        let codes = codes.max_pending_per_account(5);
        let results = futures_util::future::join_all(
            (0..20).map(|_| codes.issue(approval(ChallengeMethod::S256))),
        )
        .await;
        let made = results.iter().filter(|result| result.is_ok()).count();
        assert_eq!(made, 5);
    }

    proptest::proptest! {
        #[test]
        fn only_a_code_s_shape_parses_and_it_reads_back_the_same(text in "\\PC{0,60}", bytes in proptest::array::uniform32(0u8..)) {
            if let Some(code) = AuthCode::parse(&text) {
                proptest::prop_assert_eq!(code.expose(), text.as_str());
                proptest::prop_assert_eq!(text.len(), AuthCode::LEN);
            }
            // Every 32 bytes, written as a code is, parse back.
            let written = URL_SAFE_NO_PAD.encode(bytes);
            proptest::prop_assert!(AuthCode::parse(&written).is_some());
        }
    }

    #[test]
    fn app_keys_are_named_by_label_or_host() {
        assert_eq!(app_key_name(Some("My app"), "x.example"), "My app");
        assert_eq!(app_key_name(None, "x.example"), "x.example");
        assert_eq!(
            app_key_name(None, &"h".repeat(300)).chars().count(),
            MAX_KEY_NAME_CHARS
        );
    }
}
