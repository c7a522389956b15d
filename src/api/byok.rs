//! The routes of an account's own provider keys (BYOK): list, set, delete.
//! A key, once set, is never answered again, only its hint.

use serde_json::{Value, json};

use super::answers::{existing_account, ok, refuse, timestamp};
use super::routes::Call;
use crate::answer::Answer;
use crate::error::{ErrorKind, GatewayError};
use crate::json_input::{bad_request, invalid, invalid_parameter};
use crate::keys::{ByokEntry, ByokError, ByokProviders, input};

/// `GET /api/v1/accounts/{id}/byok`: the account's provider keys, hints
/// only.
pub(crate) async fn list_provider_keys(call: Call) -> Result<Answer, GatewayError> {
    let account = existing_account(call.directory(), call.path_account().to_owned()).await?;
    let entries = call.config.byok.list(&account).await.map_err(refuse)?;
    let data: Vec<Value> = entries.iter().map(byok_json).collect();
    Ok(ok(json!({ "data": data })))
}

/// `PUT /api/v1/accounts/{id}/byok/{provider}` `{key}`: sets the account's
/// key for a provider that takes one.
pub(crate) async fn set_provider_key(call: Call) -> Result<Answer, GatewayError> {
    let account = existing_account(call.directory(), call.path_account().to_owned()).await?;
    let provider = input::path_provider(call.param(1))?;
    accepts_byok_key(&call.config.byok_providers, &provider)?;
    let api_key = input::byok_key(call.body()?)?;
    let entry = call
        .config
        .byok
        .set(&account, &provider, &api_key)
        .await
        .map_err(|error| match error {
            ByokError::Store(error) => refuse(error),
            ByokError::TooManyKeys => bad_request("provider", error.to_string()),
            ByokError::InvalidKey(problem) => invalid("key", problem),
            // The path was checked above; kept exact all the same.
            other => GatewayError::new(ErrorKind::InvalidRequest, other.to_string()),
        })?;
    // The key itself is never answered, only its hint.
    Ok(ok(json!({ "data": byok_json(&entry) })))
}

/// `DELETE /api/v1/accounts/{id}/byok/{provider}`: `{"deleted": true}`,
/// or 404. Open for any provider, so keys set before a provider stopped
/// taking them can be cleaned up.
pub(crate) async fn delete_provider_key(call: Call) -> Result<Answer, GatewayError> {
    let account = existing_account(call.directory(), call.path_account().to_owned()).await?;
    let provider = input::path_provider(call.param(1))?;
    if call
        .config
        .byok
        .delete(&account, &provider)
        .await
        .map_err(refuse)?
    {
        Ok(ok(json!({"deleted": true})))
    } else {
        Err(GatewayError::new(
            ErrorKind::NotFound,
            format!(
                "the account {account} has no key for the provider {provider}; list its keys with GET /api/v1/accounts/{account}/byok"
            ),
        ))
    }
}

/// A provider key as the API shows it: its hint, never the key.
fn byok_json(entry: &ByokEntry) -> Value {
    json!({
        "provider": entry.provider,
        "hint": entry.hint,
        "created_at": timestamp(Some(entry.created_at)),
        "updated_at": timestamp(Some(entry.updated_at)),
    })
}

/// Whether a key for `provider` (lower case) would be sent in place of the
/// gateway's credential: one that never is, or is sent beside it, would
/// only turn the account's requests into unpaid BYOK usage.
fn accepts_byok_key(providers: &ByokProviders, provider: &str) -> Result<(), GatewayError> {
    match providers {
        ByokProviders::Any => Ok(()),
        ByokProviders::Configured { byok, .. } if byok.contains(provider) => Ok(()),
        ByokProviders::Configured { byok, others } if others.contains(provider) => {
            let what_to_do = if byok.is_empty() {
                "this gateway takes no provider keys".to_owned()
            } else {
                let names = byok.iter().map(String::as_str).collect::<Vec<_>>();
                format!("it takes keys for: {}", names.join(", "))
            };
            Err(invalid_parameter("provider", format!(
                    "the provider {provider} is reached with the gateway's own credential and does not take an account's key, so nothing was stored; {what_to_do}. The operator can allow it with \"byok\": true in the provider's section of the config, where its credential is its api_key"
                ))
            .with_metadata("reason", "byok_not_allowed"))
        }
        ByokProviders::Configured { byok, .. } => {
            let what_to_do = if byok.is_empty() {
                "this gateway takes no provider keys".to_owned()
            } else {
                let names = byok.iter().map(String::as_str).collect::<Vec<_>>();
                format!("set a key for one of the providers that take one: {}", names.join(", "))
            };
            Err(bad_request("provider", format!(
                    "the provider {provider} is not configured on this gateway, so its key would never be sent; {what_to_do}"
                ))
            .with_metadata("reason", "unknown_provider"))
        }
        ByokProviders::SingleUpstream => Err(bad_request("provider", format!(
                "this gateway sends every request to its one upstream with its own upstream key, so a provider key for {provider} would never be sent; to let accounts bring their own keys, the operator must add a `providers` section to the gateway's config naming the provider {provider}"
            ))
        .with_metadata("reason", "byok_needs_providers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_key_is_accepted_only_where_it_would_be_sent() {
        assert!(accepts_byok_key(&ByokProviders::Any, "anyone").is_ok());
        let configured = ByokProviders::Configured {
            byok: ["beta".to_owned(), "alpha".to_owned()].into(),
            others: ["delta".to_owned()].into(),
        };
        assert!(accepts_byok_key(&configured, "alpha").is_ok());
        assert!(configured.accepts("Alpha") && !configured.accepts("delta"));
        let error = accepts_byok_key(&configured, "gamma").unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.metadata()["param"], "provider");
        assert_eq!(error.metadata()["reason"], "unknown_provider");
        assert!(
            error
                .message()
                .contains("gamma is not configured on this gateway")
                && error.message().ends_with("take one: alpha, beta"),
            "{}",
            error.message()
        );
        // Configured, but its credential is the gateway's: refused, 422.
        let error = accepts_byok_key(&configured, "delta").unwrap_err();
        assert_eq!(error.status(), 422);
        assert_eq!(error.metadata()["param"], "provider");
        assert_eq!(error.metadata()["reason"], "byok_not_allowed");
        assert!(
            error
                .message()
                .contains("delta is reached with the gateway's own credential")
                && error.message().contains("nothing was stored")
                && error.message().contains("it takes keys for: alpha, beta")
                && error.message().contains("\"byok\": true"),
            "{}",
            error.message()
        );
        let none = ByokProviders::Configured {
            byok: Default::default(),
            others: ["alpha".to_owned()].into(),
        };
        let error = accepts_byok_key(&none, "alpha").unwrap_err();
        assert!(error.message().contains("takes no provider keys"));
        assert_eq!(error.metadata()["reason"], "byok_not_allowed");
        let error = accepts_byok_key(&none, "beta").unwrap_err();
        assert!(error.message().contains("takes no provider keys"));
        assert_eq!(error.metadata()["reason"], "unknown_provider");
        assert!(!ByokProviders::SingleUpstream.accepts("openai"));
        assert!(ByokProviders::Any.accepts("openai"));
        let error = accepts_byok_key(&ByokProviders::SingleUpstream, "openai").unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.metadata()["reason"], "byok_needs_providers");
        assert!(
            error.message().contains("its own upstream key")
                && error.message().contains("`providers` section")
                && error.message().contains("openai"),
            "{}",
            error.message()
        );
    }
}
