//! The key settings page in a real browser: headless Chromium driven
//! through chromedriver against the proxy example run as a process (the
//! built-in mock upstream, everything in memory).
//!
//! A person signs in with a management key, creates a key with a limit,
//! sees its usage once it is used through the API, sets its limit below
//! that usage (402 through the API), raises it (200), deletes it (401);
//! a wrong key or an inference key gets a clear message; the operator
//! manages accounts. A key reported leaked is marked so, with a notice of
//! where it was found, and is replaced and deleted from that notice. An
//! account sees its recent generations and its apps ranked (markup in an
//! app title stays text), and its activity: a chart with a bar per day
//! and model that spent credits, beside a table of the same figures. The
//! key in use offers no Disable or Delete, and
//! says why. The page's responses carry their security headers, and the
//! API allows no other origin.
//!
//! Needs Debian's `chromium` and `chromium-driver`, which
//! `./scripts/test.sh` installs. The run writes a screenshot of the
//! signed-in page to `target/tmp/settings-page.png`, never into the
//! sources: a test run leaves the checkout clean (CI packages it after).
//! Copy it to `docs/settings-page.png` when the page changes.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::browser::{Browser, Chromedriver, PATIENCE};
use common::examples::ProxyProcess;
use common::wait::{wait_for, wait_until};
use modelgate::auth::ApiKey;
use modelgate::settings::CONTENT_SECURITY_POLICY;
use serde_json::{Value, json};

/// One Chromium at a time: the machine has two cores.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A paid model of the proxy's demo prices (1000 credits per million
/// tokens), served by its built-in mock.
const PAID_MODEL: &str = "demo/paid";

/// The proxy example with `admin` as its management key (the operator's).
fn start_proxy(admin: &str) -> ProxyProcess {
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("MODELGATE_ADMIN_KEY", admin)
        .env("RUST_LOG", "warn");
    ProxyProcess::spawn(command)
}

/// The gateway's JSON API, as a client program uses it.
struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(proxy: &ProxyProcess) -> Api {
        Api {
            base: proxy.address.clone(),
            http: reqwest::Client::new(),
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// One small chat completion with `key`; its status and body.
    async fn chat(&self, key: &str) -> (u16, Value) {
        let body = json!({
            "model": PAID_MODEL,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hello"}],
        });
        self.send(
            reqwest::Method::POST,
            "/api/v1/chat/completions",
            key,
            Some(body),
        )
        .await
    }

    /// One small chat completion with `key`, sent with `headers` (an
    /// app's `HTTP-Referer` and `X-Title`, say); its generation id, once
    /// the record is there (settled), so the next request's is newer.
    async fn chat_recorded(&self, key: &str, headers: &[(&str, &str)]) -> String {
        let mut request = self
            .http
            .post(format!("{}/api/v1/chat/completions", self.base))
            .bearer_auth(key)
            .json(&json!({
                "model": PAID_MODEL,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "Hello"}],
            }));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "{headers:?}");
        let id = response.headers()["x-generation-id"]
            .to_str()
            .unwrap()
            .to_owned();
        response.bytes().await.unwrap();
        let path = format!("/api/v1/generation?id={id}");
        wait_until(PATIENCE, format_args!("{id} recorded"), || async {
            self.send(reqwest::Method::GET, &path, key, None).await.0 == 200
        })
        .await;
        id
    }

    /// Credits bought for `account` by the operator.
    async fn top_up(&self, admin: &str, account: &str, amount: f64) {
        let response = self
            .http
            .post(format!("{}/api/v1/accounts/{account}/credits", self.base))
            .bearer_auth(admin)
            .header("idempotency-key", format!("test-{account}-{amount}"))
            .json(&json!({ "amount": amount }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }

    /// The account `id`, made by the operator `admin`, and a management
    /// key for it; that key's plaintext.
    async fn account_with_manager(&self, admin: &str, id: &str) -> String {
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                "/api/v1/accounts",
                admin,
                Some(json!({"id": id, "name": "Acme Ltd", "email": "ops@acme.example"})),
            )
            .await;
        assert_eq!(status, 201, "the operator creates an account: {body}");
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                "/api/v1/keys",
                admin,
                Some(json!({"name": format!("{id} admin"), "account": id, "management": true})),
            )
            .await;
        assert_eq!(
            status, 201,
            "the operator makes {id} a management key: {body}"
        );
        body["key"].as_str().unwrap().to_owned()
    }

    /// What `GET /api/v1/key` answers `key`: its status and
    /// `error.metadata.reason` (null when served).
    async fn check_key(&self, key: &str) -> (u16, Value) {
        let (status, body) = self
            .send(reqwest::Method::GET, "/api/v1/key", key, None)
            .await;
        (status, body["error"]["metadata"]["reason"].clone())
    }

    /// The keys `key` may list, by name.
    async fn key_named(&self, key: &str, name: &str) -> Option<Value> {
        let (status, list) = self
            .send(
                reqwest::Method::GET,
                "/api/v1/keys?include_disabled=true",
                key,
                None,
            )
            .await;
        assert_eq!(status, 200, "{list}");
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|record| record["name"] == name)
            .cloned()
    }
}

/// Opens the page and signs in with `key`; fails unless the key table shows.
async fn sign_in(browser: &Browser, proxy: &ProxyProcess, key: &str) {
    browser.goto(&format!("{}/settings", proxy.address)).await;
    assert_eq!(
        browser.client.title().await.unwrap(),
        "Key settings · modelgate"
    );
    browser.watch_csp().await;
    browser.fill("sign-in", "Management key", key).await;
    browser.click(Some("sign-in"), "Sign in").await;
    browser.wait_shown("keys", true).await;
    // The key lives in the tab's sessionStorage only: no cookie, no URL.
    assert_eq!(
        browser
            .script("return sessionStorage.getItem('modelgate.managementKey')")
            .await,
        key
    );
    assert!(browser.client.get_all_cookies().await.unwrap().is_empty());
    let url = browser.client.current_url().await.unwrap();
    assert!(!url.as_str().contains(key) && url.path() == "/settings");
}

/// What picks the row of the key named `name` (its name cell also shows
/// the key's hint).
fn key_row(name: &str) -> String {
    format!("td/span[contains(concat(' ', @class, ' '), ' key-name ')][normalize-space()='{name}']")
}

/// The text of the part `class` (a cell, or a value within one: `created`,
/// `usage-daily`, …) in the row of the key named `name`, or `None` while
/// the table has no such row.
async fn cell(browser: &Browser, name: &str, class: &str) -> Option<String> {
    let xpath = format!(
        "//tbody[@id='key-rows']/tr[{}]//*[contains(concat(' ', @class, ' '), ' {class} ')]",
        key_row(name)
    );
    // The table may be drawn anew between finding the cell and reading it.
    wait_for(PATIENCE, || async {
        let Ok(element) = browser
            .client
            .find(fantoccini::Locator::XPath(&xpath))
            .await
        else {
            return Ok(None);
        };
        match element.text().await {
            Ok(text) => Ok(Some(text)),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

/// Waits until the table shows what `check` wants in column `class` of
/// the row of `name` (`None`: no such row). The page shows an action's
/// outcome first, then reloads the table.
async fn wait_for_cell(
    browser: &Browser,
    name: &str,
    class: &str,
    what: &str,
    check: impl Fn(Option<&str>) -> bool,
) {
    wait_for(PATIENCE, || async {
        let text = cell(browser, name, class).await;
        if check(text.as_deref()) {
            Ok(())
        } else {
            Err(format!(
                "the key {name} never showed {what} in {class}: {text:?}"
            ))
        }
    })
    .await;
}

/// How long a Refresh is given to draw its answer before it is clicked
/// again: a load started later overtakes one still under way, so clicking
/// at every look could keep a slow one from ever showing.
const REFRESH_EVERY: Duration = Duration::from_millis(300);

/// Waits until `look` answers `Ok`, clicking the Refresh button of `scope`
/// while it does not (at most every [`REFRESH_EVERY`]); its value.
async fn refreshing_until<T, Fut>(browser: &Browser, scope: &str, look: impl Fn() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let clicked = std::cell::Cell::new(None::<Instant>);
    wait_for(PATIENCE, || async {
        match look().await {
            Ok(value) => Ok(value),
            Err(seen) => {
                if clicked.get().is_none_or(|at| at.elapsed() >= REFRESH_EVERY) {
                    browser.click(Some(scope), "Refresh").await;
                    clicked.set(Some(Instant::now()));
                }
                Err(seen)
            }
        }
    })
    .await
}

/// Clicks Refresh until the row of `name` shows `check` in column `class`.
async fn refresh_until(
    browser: &Browser,
    name: &str,
    class: &str,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    refreshing_until(browser, "keys", || async {
        match cell(browser, name, class).await {
            Some(text) if check(&text) => Ok(text),
            Some(text) => Err(format!(
                "the key {name} never showed {what} in {class}: {text:?}"
            )),
            None => Err(format!("no row for the key {name}")),
        }
    })
    .await
}

/// Clicks the element at `xpath` (`what`, for the failure message).
async fn click_path(browser: &Browser, xpath: &str, what: &str) {
    // The table may be drawn anew between finding the button and clicking it.
    wait_for(PATIENCE, || async {
        match browser.client.find(fantoccini::Locator::XPath(xpath)).await {
            Ok(button) => button
                .click()
                .await
                .map_err(|error| format!("no {what}: {error}")),
            Err(error) => Err(format!("no {what}: {error}")),
        }
    })
    .await;
}

/// Clicks Create key and reads the new key, shown once.
async fn create_on_page(browser: &Browser) -> String {
    browser.click(Some("create-key"), "Create key").await;
    browser.wait_shown("new-key", true).await;
    browser
        .by_id("new-key-value")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap()
}

/// Opens the editor of the key `name`.
async fn edit(browser: &Browser, name: &str) {
    let xpath = format!("//tbody[@id='key-rows']//button[@aria-label='Edit key {name}']");
    click_path(browser, &xpath, &format!("Edit for {name}")).await;
    browser.wait_shown("edit-key", true).await;
}

/// Saves the editor with `limit` in the Credit limit field (empty: none)
/// and waits for the page to say so.
async fn save_limit(browser: &Browser, name: &str, limit: &str) {
    edit(browser, name).await;
    browser.fill("edit-key", "Credit limit", limit).await;
    browser.click(Some("edit-key"), "Save").await;
    let expected = if limit.is_empty() {
        "no limit".to_owned()
    } else {
        format!("limit {limit} credits")
    };
    browser
        .wait_for_text("message", &expected, |text| {
            text.contains("Saved the key") && text.contains(&expected)
        })
        .await;
}

/// The key's life on the page, signed in with a management key that may
/// manage keys of `account` (whose balance pays for the requests): create
/// with a limit, use through the API, usage shown, limit below usage →
/// 402, raised → 200, removed → 200, deleted → 401. `screenshot`: where
/// to keep a picture of the page with the key in use.
async fn a_key_from_creation_to_deletion(
    browser: &Browser,
    api: &Api,
    manager: &str,
    name: &str,
    screenshot: Option<&std::path::Path>,
) {
    // Created with a daily limit of 1 credit.
    browser.fill("create-key", "Name", name).await;
    browser.fill("create-key", "Credit limit", "1").await;
    browser.select("create-key", "Limit reset", "daily").await;
    let plaintext = create_on_page(browser).await;
    assert!(plaintext.starts_with("mg-v1-"), "{plaintext}");
    assert!(browser.text("message").await.contains("not shown again"));
    let record = api
        .key_named(manager, name)
        .await
        .expect("the key is created");
    assert_eq!(
        (record["limit"].clone(), record["limit_reset"].clone()),
        (json!(1), json!("daily"))
    );
    wait_for_cell(browser, name, "status", "active", |text| {
        text == Some("active")
    })
    .await;
    assert_eq!(cell(browser, name, "usage-daily").await.unwrap(), "0");
    // The row tells the key apart by its hint: its first and last
    // characters, never more.
    let hint = format!("{}…{}", &plaintext[..9], &plaintext[plaintext.len() - 4..]);
    let name_cell = cell(browser, name, "name").await.unwrap();
    assert_eq!(name_cell, format!("{name}\n{hint}"));
    assert_eq!(cell(browser, name, "expires").await.unwrap(), "never");
    browser.click(Some("new-key"), "Done").await;
    browser.wait_shown("new-key", false).await;

    // An expiry set in the editor shows in its column and holds in the
    // API; cleared, the key never expires again.
    edit(browser, name).await;
    browser
        .client
        .execute(
            "document.getElementById('edit-expires').value = '2099-06-01T12:00';",
            vec![],
        )
        .await
        .unwrap();
    browser.click(Some("edit-key"), "Save").await;
    wait_for_cell(browser, name, "expires", "the expiry", |text| {
        text.is_some_and(|text| text.contains("2099"))
    })
    .await;
    let record = api.key_named(manager, name).await.unwrap();
    assert!(
        record["expires_at"]
            .as_str()
            .unwrap()
            .starts_with("2099-06-01"),
        "{record}"
    );
    assert_eq!(record["hint"], hint.as_str());
    edit(browser, name).await;
    browser
        .client
        .execute(
            "document.getElementById('edit-expires').value = '';",
            vec![],
        )
        .await
        .unwrap();
    browser.click(Some("edit-key"), "Save").await;
    wait_for_cell(browser, name, "expires", "never", |text| {
        text == Some("never")
    })
    .await;
    assert_eq!(
        api.key_named(manager, name).await.unwrap()["expires_at"],
        Value::Null
    );

    // Used through the API; its usage shows once the cost has settled.
    let (status, body) = api.chat(&plaintext).await;
    assert_eq!(status, 200, "{body}");
    let used = refresh_until(browser, name, "usage-daily", "usage", |text| text != "0").await;
    let used: f64 = used.parse().unwrap();
    assert!(used > 0.0 && used < 0.1, "{used}");
    for class in ["usage-weekly", "usage-monthly"] {
        assert_eq!(
            cell(browser, name, class)
                .await
                .unwrap()
                .parse::<f64>()
                .unwrap(),
            used
        );
    }
    let limit_cell = cell(browser, name, "limit").await.unwrap();
    assert!(limit_cell.contains("left today"), "{limit_cell}");
    if let Some(path) = screenshot {
        browser.screenshot(path).await;
    }

    // A limit below what it used today: the API refuses it, 402, and the
    // bar shows the limit used up.
    assert!(used > 0.001, "{used}");
    save_limit(browser, name, "0.001").await;
    let (status, body) = api.chat(&plaintext).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(body["error"]["metadata"]["limit_source"], "key_limit");
    refresh_until(browser, name, "limit", "the limit used up", |text| {
        text.starts_with("0.001") && text.contains("\n0 left today")
    })
    .await;
    let bar = browser
        .client
        .find(fantoccini::Locator::XPath(&format!(
            "//tbody[@id='key-rows']/tr[{}]//progress",
            key_row(name)
        )))
        .await
        .unwrap();
    assert_eq!(bar.attr("class").await.unwrap().as_deref(), Some("full"));

    // Raised: served again.
    save_limit(browser, name, "5").await;
    let (status, body) = api.chat(&plaintext).await;
    assert_eq!(status, 200, "{body}");

    // Removed (the field cleared sends null): no limit at all.
    save_limit(browser, name, "").await;
    assert_eq!(
        api.key_named(manager, name).await.unwrap()["limit"],
        Value::Null
    );
    wait_for_cell(browser, name, "limit", "no limit", |text| {
        text == Some("No limit")
    })
    .await;

    // Deleted after the in-page confirmation: the key is refused.
    edit(browser, name).await;
    browser.click(Some("edit-key"), "Delete").await;
    browser.wait_shown("confirm-delete", true).await;
    // Nothing is deleted before the confirmation.
    assert!(api.key_named(manager, name).await.is_some());
    browser
        .click(Some("confirm-delete"), "Yes, delete the key")
        .await;
    browser
        .wait_for_text("message", "the deletion", |text| {
            text.contains(&format!("Deleted the key “{name}”"))
        })
        .await;
    wait_for_cell(browser, name, "name", "no row", |text| text.is_none()).await;
    let (status, body) = api.chat(&plaintext).await;
    assert_eq!(status, 401, "{body}");
    assert!(api.key_named(manager, name).await.is_none());
}

/// The operator's key manages a key of its own account on the page.
/// Needs only the key management API the gateway has had all along.
#[tokio::test]
async fn the_operator_manages_a_key_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    // The operator's page starts on the default account; its keys go there.
    api.top_up(admin, "default", 10.0).await;
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    sign_in(&browser, &proxy, admin).await;
    assert!(browser.text("who").await.contains("“operator”"));
    // The style sheet applies (the policy lets the page's own file in).
    let button = browser.button(Some("create-key"), "Create key").await;
    assert_eq!(
        button.css_value("background-color").await.unwrap(),
        "rgba(36, 87, 197, 1)"
    );
    // A reload keeps the person signed in (the tab's sessionStorage).
    browser.client.refresh().await.unwrap();
    browser.wait_shown("keys", true).await;
    assert!(!browser.displayed("sign-in").await);
    browser.watch_csp().await;

    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("settings-page.png");
    a_key_from_creation_to_deletion(&browser, &api, admin, "ci pipeline", Some(&screenshot)).await;
    // Nothing the page did as it ran was blocked by its own policy.
    assert_eq!(browser.csp_violations().await, json!([]));

    // Signing out forgets the key.
    browser.click(None, "Sign out").await;
    browser.wait_shown("sign-in", true).await;
    assert!(!browser.displayed("keys").await);
    assert_eq!(browser.script("return sessionStorage.length").await, 0);
    browser.client.refresh().await.unwrap();
    browser.wait_shown("sign-in", true).await;
    assert!(!browser.displayed("keys").await);
    browser.close().await;
}

/// A proxy with a new operator's key, its default account holding 10
/// credits, and the page signed in with that key, its policy watched.
struct OperatorPage {
    // Dropped in this order: the page, its driver, then the browser lock.
    browser: Browser,
    _driver: Chromedriver,
    api: Api,
    admin: String,
    _proxy: ProxyProcess,
    _one_browser: tokio::sync::MutexGuard<'static, ()>,
}

impl OperatorPage {
    async fn open() -> OperatorPage {
        let one_browser = BROWSER.lock().await;
        let admin = ApiKey::generate().expose().to_owned();
        let proxy = start_proxy(&admin);
        let api = Api::new(&proxy);
        api.top_up(&admin, "default", 10.0).await;
        let driver = Chromedriver::start();
        let browser = driver.browser().await;
        sign_in(&browser, &proxy, &admin).await;
        browser.watch_csp().await;
        OperatorPage {
            browser,
            _driver: driver,
            api,
            admin,
            _proxy: proxy,
            _one_browser: one_browser,
        }
    }

    async fn close(self) {
        self.browser.close().await;
    }
}

/// Rotate gives a key's successor, shown once as a new key is; the old
/// key keeps working for its grace and shows as replaced; a replaced key
/// offers no second rotation.
#[tokio::test]
async fn a_key_is_rotated_on_the_page() {
    let page = OperatorPage::open().await;
    let (browser, api, admin) = (&page.browser, &page.api, page.admin.as_str());

    browser.fill("create-key", "Name", "deploy").await;
    browser.fill("create-key", "Credit limit", "2").await;
    let old = create_on_page(browser).await;
    browser.click(Some("new-key"), "Done").await;
    browser.wait_shown("new-key", false).await;
    let before = api.key_named(admin, "deploy").await.unwrap();

    // Rotate asks first, and says what becomes of the key; kept, nothing
    // changes.
    let rotate = "//tbody[@id='key-rows']//button[@aria-label='Rotate key deploy']";
    click_path(browser, rotate, "Rotate for deploy").await;
    browser.wait_shown("confirm-rotate", true).await;
    let asked = browser.text("confirm-rotate-text").await;
    assert!(
        asked.contains("Rotate the key “deploy”")
            && asked.contains("keeps working for an hour")
            && !asked.contains("signed in with"),
        "{asked}"
    );
    browser
        .click(Some("confirm-rotate"), "Keep the key as it is")
        .await;
    browser.wait_shown("confirm-rotate", false).await;
    let (_, listed) = api
        .send(reqwest::Method::GET, "/api/v1/keys", admin, None)
        .await;
    assert_eq!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|key| key["name"] == "deploy")
            .count(),
        1,
        "nothing rotated before the confirmation: {listed}"
    );
    assert!(!browser.displayed("new-key").await);
    click_path(browser, rotate, "Rotate for deploy").await;
    browser.wait_shown("confirm-rotate", true).await;
    browser
        .click(Some("confirm-rotate"), "Yes, rotate the key")
        .await;
    browser.wait_shown("new-key", true).await;
    let new = browser
        .by_id("new-key-value")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    assert!(new.starts_with("mg-v1-") && new != old, "{new}");
    browser
        .wait_for_text("message", "the old key's grace", |text| {
            text.contains("Rotated the key “deploy”")
                && text.contains("The old key works until")
                && text.contains(" UTC.")
        })
        .await;
    browser.click(Some("new-key"), "Done").await;

    // Two rows of that name now: the old one replaced, both working.
    let (status, listed) = api
        .send(reqwest::Method::GET, "/api/v1/keys", admin, None)
        .await;
    assert_eq!(status, 200);
    let named: Vec<&Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| key["name"] == "deploy")
        .collect();
    assert_eq!(named.len(), 2, "{listed}");
    let successor = named
        .iter()
        .find(|key| key["hash"] != before["hash"])
        .unwrap();
    assert_eq!(successor["limit"], before["limit"]);
    let replaced = named
        .iter()
        .find(|key| key["hash"] == before["hash"])
        .unwrap();
    assert_eq!(replaced["rotated_to"], successor["hash"]);
    let replaced_row = format!(
        "//tbody[@id='key-rows']/tr[@data-hash='{}']",
        before["hash"].as_str().unwrap()
    );
    let badge = browser
        .client
        .wait()
        .for_element(fantoccini::Locator::XPath(&format!(
            "{replaced_row}//span[contains(@class, 'rotating')]"
        )))
        .await
        .unwrap();
    assert_eq!(badge.text().await.unwrap(), "replaced");
    let offered = browser
        .client
        .find_all(fantoccini::Locator::XPath(&format!(
            "{replaced_row}//button[starts-with(@aria-label, 'Rotate')]"
        )))
        .await
        .unwrap();
    assert!(offered.is_empty(), "a replaced key is rotated once");
    for key in [&old, &new] {
        let (status, body) = api.chat(key).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(browser.csp_violations().await, json!([]));
    page.close().await;
}

/// A key's model list and rate are set when it is made, shown in its row,
/// changed and lifted in the editor, and hold at the API each time; bad
/// entries get the API's or the form's own message.
#[tokio::test]
async fn a_keys_models_and_rate_are_set_and_changed_on_the_page() {
    let page = OperatorPage::open().await;
    let (browser, api, admin) = (&page.browser, &page.api, page.admin.as_str());

    browser.fill("create-key", "Name", "narrow").await;
    browser.fill("create-key", "Allowed models", "other/").await;
    browser.fill("create-key", "Requests", "2").await;
    browser.fill("create-key", "per seconds", "60").await;
    let key = create_on_page(browser).await;
    browser.click(Some("new-key"), "Done").await;
    let record = api.key_named(admin, "narrow").await.unwrap();
    assert_eq!(record["allowed_models"], json!(["other/"]));
    assert_eq!(
        record["rate_limit"],
        json!({"requests": 2, "window_seconds": 60})
    );
    wait_for_cell(browser, "narrow", "name", "its bounds", |text| {
        text.is_some_and(|text| {
            text.contains("Models: other/") && text.contains("2 requests per 60 s")
        })
    })
    .await;
    let (status, body) = api.chat(&key).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["metadata"]["reason"], "model_not_allowed");

    // The editor shows both; the model it calls is added.
    edit(browser, "narrow").await;
    assert_eq!(
        browser
            .by_id("edit-models")
            .await
            .prop("value")
            .await
            .unwrap()
            .unwrap(),
        "other/"
    );
    assert_eq!(
        browser
            .by_id("edit-rate-requests")
            .await
            .prop("value")
            .await
            .unwrap()
            .unwrap(),
        "2"
    );
    browser
        .fill("edit-key", "Allowed models", "demo/paid, other/")
        .await;
    browser.click(Some("edit-key"), "Save").await;
    wait_for_cell(browser, "narrow", "name", "the new list", |text| {
        text.is_some_and(|text| text.contains("Models: demo/paid, other/"))
    })
    .await;
    // Two a minute, the refused 403 not among them.
    for expected in [200, 200, 429] {
        let (status, body) = api.chat(&key).await;
        assert_eq!(status, expected, "{body}");
        if status == 429 {
            assert_eq!(body["error"]["metadata"]["limit_source"], "key");
        }
    }

    // A bad entry is the API's 422, a half rate the form's own message;
    // neither changes the key.
    edit(browser, "narrow").await;
    browser.fill("edit-key", "Allowed models", "gpt-4o").await;
    browser.click(Some("edit-key"), "Save").await;
    browser
        .wait_for_text("message", "the refused entry", |text| {
            text.contains("allowed_models") && text.contains("gpt-4o")
        })
        .await;
    browser.fill("edit-key", "Allowed models", "demo/").await;
    browser.fill("edit-key", "per seconds", "").await;
    browser.click(Some("edit-key"), "Save").await;
    browser
        .wait_for_text("message", "the half rate", |text| {
            text.contains("needs both")
        })
        .await;
    let record = api.key_named(admin, "narrow").await.unwrap();
    assert_eq!(record["allowed_models"], json!(["demo/paid", "other/"]));

    // Both cleared: every model, no rate of its own.
    browser.fill("edit-key", "Allowed models", "").await;
    browser.fill("edit-key", "Requests", "").await;
    browser.click(Some("edit-key"), "Save").await;
    browser
        .wait_for_text("message", "the save", |text| {
            text.contains("Saved the key “narrow”")
        })
        .await;
    let record = api.key_named(admin, "narrow").await.unwrap();
    assert_eq!(
        (
            record["allowed_models"].clone(),
            record["rate_limit"].clone()
        ),
        (Value::Null, Value::Null)
    );
    let (status, body) = api.chat(&key).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(browser.csp_violations().await, json!([]));
    page.close().await;
}

/// The generations table pages through the account's records, twenty at a
/// time, and exports them as one CSV file.
#[tokio::test]
async fn generations_are_paged_and_exported_on_the_page() {
    let page = OperatorPage::open().await;
    let (browser, api, admin) = (&page.browser, &page.api, page.admin.as_str());
    let (status, created) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            admin,
            Some(json!({"name": "bot"})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let client = created["key"].as_str().unwrap().to_owned();
    for _ in 0..23 {
        let (status, body) = api.chat(&client).await;
        assert_eq!(status, 200, "{body}");
    }
    browser.click(Some("generations"), "Refresh").await;
    let newest = generations_until(browser, 20).await;
    assert!(browser.text("generation-caption").await.contains("1 to 20"));
    let older = browser.by_id("generations-older").await;
    let newer = browser.by_id("generations-newer").await;
    assert!(older.is_enabled().await.unwrap());
    assert!(!newer.is_enabled().await.unwrap());
    browser.click(Some("generations"), "Older").await;
    let rest = generations_until(browser, 3).await;
    assert!(
        browser
            .text("generation-caption")
            .await
            .contains("21 to 23")
    );
    assert!(!older.is_enabled().await.unwrap());
    assert!(newer.is_enabled().await.unwrap());
    let ids: std::collections::BTreeSet<&str> = newest
        .iter()
        .chain(&rest)
        .map(|row| row["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 23, "every record on one page or the other");
    browser.click(Some("generations"), "Newer").await;
    generations_until(browser, 20).await;

    browser.click(Some("generations"), "Download CSV").await;
    browser
        .wait_for_text("message", "the export", |text| {
            text.contains("Downloaded 23 generations as CSV")
        })
        .await;
    let link = browser.by_id("generations-csv-file").await;
    assert_eq!(
        link.attr("download").await.unwrap().as_deref(),
        Some("generations-default.csv")
    );
    assert!(
        link.attr("href")
            .await
            .unwrap()
            .is_some_and(|href| href.starts_with("blob:"))
    );
    assert_eq!(browser.csp_violations().await, json!([]));
    page.close().await;
}

/// An account's own management key: sees its account's balance, free tier
/// and free-model requests, and manages that account's keys.
///
/// Needs the accounts API: `POST /api/v1/accounts` and
/// `POST /api/v1/keys` with `account` and `management` for the operator.
#[tokio::test]
async fn an_account_manager_manages_a_key_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    let manager = api.account_with_manager(admin, "acme").await;
    // A key of another account, which acme's manager must not see.
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            admin,
            Some(json!({"name": "someone else's"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    // Before any purchase: free tier, the smaller free-model quota.
    sign_in(&browser, &proxy, &manager).await;
    browser.wait_shown("account", true).await;
    assert!(browser.text("account-title").await.contains("acme"));
    assert_eq!(browser.text("account-balance").await, "0 credits");
    assert!(browser.text("account-free-tier").await.starts_with("Yes"));
    assert_eq!(browser.text("account-free-requests").await, "50 of 50");
    assert!(
        !browser.displayed("accounts").await,
        "the operator's part stays hidden"
    );
    wait_for_cell(&browser, "acme admin", "name", "its row", |text| {
        text.is_some()
    })
    .await;
    assert!(cell(&browser, "someone else's", "name").await.is_none());

    // The operator tops the account up; the page shows it.
    api.top_up(admin, "acme", 12.5).await;
    browser.click(Some("keys"), "Refresh").await;
    browser
        .wait_for_text("account-balance", "the top-up", |text| {
            text == "12.5 credits"
        })
        .await;
    assert_eq!(browser.text("account-free-tier").await, "No");
    assert_eq!(browser.text("account-free-requests").await, "1000 of 1000");

    a_key_from_creation_to_deletion(&browser, &api, &manager, "acme ci", None).await;
    // The key went to acme, and acme paid for it.
    browser.click(Some("keys"), "Refresh").await;
    browser
        .wait_for_text("account-balance", "acme's payments", |text| {
            let balance: f64 = text.trim_end_matches(" credits").parse().unwrap();
            balance < 12.5 && balance > 12.0
        })
        .await;
    browser.close().await;
}

/// The key in use, as its holder meets it on the page (issue 34, point 3):
/// marked "in use"; its editor offers no Disable and no Delete, and says
/// why and whom to ask to rotate it before anything is clicked; its other
/// settings still save; another key keeps both. The API refuses anyway
/// (409 `own_key`; 403 for a rotation, a management key being the
/// operator's to rotate).
#[tokio::test]
async fn the_key_in_use_cannot_disable_or_delete_itself_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    let manager = api.account_with_manager(admin, "acme").await;
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            &manager,
            Some(json!({"name": "acme app"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    sign_in(&browser, &proxy, &manager).await;
    wait_for_cell(&browser, "acme admin", "status", "in use", |text| {
        text.is_some_and(|text| text.contains("in use"))
    })
    .await;
    let app_status = cell(&browser, "acme app", "status").await.unwrap();
    assert!(!app_status.contains("in use"), "{app_status}");

    edit(&browser, "acme admin").await;
    let note = browser.text("edit-current-note").await;
    assert!(browser.displayed("edit-current-note").await);
    assert!(
        note.contains("the key you are signed in with")
            && note.contains("cannot disable or delete itself")
            && note.contains("the operator's to rotate"),
        "{note}"
    );
    let disabled_switch = browser.by_id("edit-disabled").await;
    let delete = browser.by_id("delete-key").await;
    for (control, what) in [(&disabled_switch, "Disabled"), (&delete, "Delete")] {
        assert!(!control.is_enabled().await.unwrap(), "{what} is offered");
        assert_eq!(
            control.attr("aria-describedby").await.unwrap().as_deref(),
            Some("edit-current-note"),
            "{what}"
        );
    }
    // A click on Delete does nothing: no confirmation, nothing deleted
    // (once the page has run whatever the click queued).
    let _ = delete.click().await;
    browser.settled().await;
    assert!(!browser.displayed("confirm-delete").await);
    // Its other settings still save.
    browser.click(Some("edit-key"), "Cancel").await;
    save_limit(&browser, "acme admin", "5").await;
    let own = api.key_named(&manager, "acme admin").await.unwrap();
    assert_eq!(
        (own["limit"].clone(), own["disabled"].clone()),
        (json!(5), json!(false))
    );

    // Another key keeps both actions, with no note.
    browser.click(Some("edit-key"), "Cancel").await;
    edit(&browser, "acme app").await;
    assert!(!browser.displayed("edit-current-note").await);
    assert!(
        browser
            .by_id("edit-disabled")
            .await
            .is_enabled()
            .await
            .unwrap()
    );
    assert!(
        browser
            .by_id("delete-key")
            .await
            .is_enabled()
            .await
            .unwrap()
    );

    // The API refuses what the page does not offer.
    let hash = own["hash"].as_str().unwrap();
    for (method, body) in [
        (reqwest::Method::PATCH, Some(json!({"disabled": true}))),
        (reqwest::Method::DELETE, None),
    ] {
        let (status, body) = api
            .send(
                method.clone(),
                &format!("/api/v1/keys/{hash}"),
                &manager,
                body,
            )
            .await;
        assert_eq!(status, 409, "{method} {body}");
        assert_eq!(body["error"]["metadata"]["reason"], "own_key");
    }
    assert_eq!(api.check_key(&manager).await.0, 200);

    // A management key is the operator's to rotate: the page offers the
    // account's manager no Rotate on it (its note says whom to ask), and
    // the API refuses one.
    browser.click(Some("edit-key"), "Cancel").await;
    let rotate_buttons = browser
        .script(
            "return document.querySelectorAll(\"#key-rows button[aria-label='Rotate key acme admin']\").length",
        )
        .await;
    assert_eq!(
        rotate_buttons,
        json!(0),
        "Rotate offered on a management key"
    );
    assert!(
        note.contains("ask the gateway's operator to rotate it"),
        "{note}"
    );
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/keys/{hash}/rotate"),
            &manager,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(api.check_key(&manager).await.0, 200);
    assert_eq!(browser.csp_violations().await, json!([]));
    browser.close().await;
}

/// A key reported leaked, as its owner meets it: the account's manager
/// sees when each key was last used; after the report the key is marked
/// leaked, a notice says when, by whom and where it was found (a link
/// shown as text, whatever it holds), the editor offers no way to enable
/// it, and the notice's buttons create its replacement (same name and
/// limit, shown once, working) and delete it (then refused as deleted).
#[tokio::test]
async fn a_leaked_key_is_replaced_and_deleted_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    let manager = api.account_with_manager(admin, "acme").await;
    let driver = Chromedriver::start();
    let browser = driver.browser().await;
    sign_in(&browser, &proxy, &manager).await;

    // Created on the page with a weekly limit; never used yet.
    browser.fill("create-key", "Name", "acme app").await;
    browser.fill("create-key", "Credit limit", "2").await;
    browser.select("create-key", "Limit reset", "weekly").await;
    let leaked = create_on_page(&browser).await;
    browser.click(Some("new-key"), "Done").await;
    wait_for_cell(&browser, "acme app", "last-used", "never", |text| {
        text == Some("never")
    })
    .await;

    // Used once: its last use shows (written in the background).
    assert_eq!(api.check_key(&leaked).await.0, 200);
    refresh_until(&browser, "acme app", "last-used", "its last use", |text| {
        text != "never"
    })
    .await;
    let record = api.key_named(&manager, "acme app").await.unwrap();
    let hash = record["hash"].as_str().unwrap().to_owned();
    let row = format!("//tbody[@id='key-rows']/tr[@data-hash='{hash}']");
    let last_used = browser
        .client
        .find(fantoccini::Locator::XPath(&format!(
            "{row}//*[contains(@class, 'last-used')]/time"
        )))
        .await
        .unwrap();
    assert!(record["last_used_at"].is_string(), "{record}");
    assert_eq!(
        last_used.attr("datetime").await.unwrap().as_deref(),
        record["last_used_at"].as_str()
    );

    // Reported leaked by the operator, with where it was found; a second
    // key with markup in its report's URL.
    let url = "https://github.com/acme/app/blob/main/.env";
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/keys/{hash}/leaked"),
            admin,
            Some(json!({"url": url, "source": "content"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            &manager,
            Some(json!({"name": "acme web"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let web_hash = body["data"]["hash"].as_str().unwrap().to_owned();
    let marked_up = "https://github.com/acme/web/blob/main/app.js?q=<b>x</b>";
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/keys/{web_hash}/leaked"),
            admin,
            Some(json!({ "url": marked_up })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(api.check_key(&leaked).await, (401, json!("leaked_key")));

    // The page marks both and says what happened, and where.
    refresh_until(&browser, "acme app", "status", "leaked", |text| {
        text == "leaked"
    })
    .await;
    assert_eq!(
        cell(&browser, "acme web", "status").await.as_deref(),
        Some("leaked")
    );
    browser.wait_shown("leaks", true).await;
    assert_eq!(
        browser
            .by_id("leaks")
            .await
            .attr("role")
            .await
            .unwrap()
            .as_deref(),
        Some("alert")
    );
    let item = format!("//ul[@id='leak-list']/li[@data-hash='{hash}']");
    let notice = browser
        .client
        .find(fantoccini::Locator::XPath(&item))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for part in [
        "acme app was reported leaked on ",
        " by the operator.",
        &format!("Found in content at {url}"),
    ] {
        assert!(notice.contains(part), "{part:?} in {notice:?}");
    }
    let reported_at = browser
        .client
        .find(fantoccini::Locator::XPath(&format!("{item}//time")))
        .await
        .unwrap()
        .attr("datetime")
        .await
        .unwrap();
    let record = api.key_named(&manager, "acme app").await.unwrap();
    assert_eq!(
        reported_at.as_deref(),
        record["leak"]["reported_at"].as_str()
    );
    for (hash, url) in [(&hash, url), (&web_hash, marked_up)] {
        let link = browser
            .client
            .find(fantoccini::Locator::XPath(&format!(
                "//ul[@id='leak-list']/li[@data-hash='{hash}']//a"
            )))
            .await
            .unwrap();
        assert_eq!(link.attr("href").await.unwrap().as_deref(), Some(url));
        assert_eq!(link.text().await.unwrap(), url, "shown as text");
        assert_eq!(
            link.attr("rel").await.unwrap().as_deref(),
            Some("noopener noreferrer")
        );
        assert_eq!(
            link.attr("target").await.unwrap().as_deref(),
            Some("_blank")
        );
    }
    assert_eq!(
        browser
            .script("return document.querySelectorAll('#leaks b, #key-rows b').length")
            .await,
        0,
        "the report's markup stays text"
    );

    // On a narrow window the page still fits: the table is stacked, a
    // card per key, and scrolls nowhere; the notice wraps.
    browser.client.set_window_size(400, 900).await.unwrap();
    assert_eq!(
        browser
            .script(
                "const page = document.documentElement; \
                 const wrap = document.querySelector('#keys .table-wrap'); \
                 return [page.scrollWidth <= page.clientWidth, wrap.scrollWidth <= wrap.clientWidth]"
            )
            .await,
        json!([true, true])
    );
    browser
        .button(Some("leak-list"), "Create a replacement")
        .await;
    browser.client.set_window_size(1280, 1000).await.unwrap();

    // The editor does not offer to enable it, and says why.
    edit(&browser, "acme app").await;
    let disabled = browser.field("edit-key", "Disabled").await;
    assert!(disabled.is_selected().await.unwrap());
    assert!(
        !disabled.is_enabled().await.unwrap(),
        "no enabling a leaked key"
    );
    assert!(browser.displayed("edit-disabled-note").await);
    browser.click(Some("edit-key"), "Cancel").await;
    browser.wait_shown("edit-key", false).await;

    // "Create a replacement": the create form with its settings; the new
    // key is shown once and works.
    click_path(
        &browser,
        &format!("{item}//button[@aria-label='Create a replacement for key acme app']"),
        "Create a replacement",
    )
    .await;
    for (id, value) in [
        ("new-name", "acme app"),
        ("new-limit", "2"),
        ("new-reset", "weekly"),
    ] {
        assert_eq!(
            browser
                .by_id(id)
                .await
                .prop("value")
                .await
                .unwrap()
                .as_deref(),
            Some(value),
            "{id}"
        );
    }
    let replacement = create_on_page(&browser).await;
    assert!(replacement.starts_with("mg-v1-") && replacement != leaked);
    assert!(browser.text("message").await.contains("not shown again"));
    assert_eq!(api.check_key(&replacement).await.0, 200);
    browser.click(Some("new-key"), "Done").await;
    browser.wait_shown("new-key", false).await;
    let (_, list) = api
        .send(
            reqwest::Method::GET,
            "/api/v1/keys?include_disabled=true",
            &manager,
            None,
        )
        .await;
    let new_record = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|key| key["name"] == "acme app" && key["hash"] != hash.as_str())
        .expect("the replacement, by the same name")
        .clone();
    assert_eq!(
        (
            &new_record["limit"],
            &new_record["limit_reset"],
            &new_record["leak"]
        ),
        (&json!(2), &json!("weekly"), &Value::Null)
    );

    // "Delete": the confirmation step first, then the leaked key is gone.
    click_path(
        &browser,
        &format!("{item}//button[@aria-label='Delete key acme app']"),
        "Delete",
    )
    .await;
    browser.wait_shown("confirm-delete", true).await;
    assert_eq!(
        api.check_key(&leaked).await,
        (401, json!("leaked_key")),
        "not deleted yet"
    );
    assert!(api.key_named(&manager, "acme web").await.is_some());
    browser
        .click(Some("confirm-delete"), "Yes, delete the key")
        .await;
    browser
        .wait_for_text("message", "the deletion", |text| {
            text.contains("Deleted the key “acme app”")
        })
        .await;
    let shown = format!("{row} | {item}");
    wait_until(PATIENCE, "the leaked key no longer shown", || async {
        browser
            .client
            .find(fantoccini::Locator::XPath(&shown))
            .await
            .is_err()
    })
    .await;
    assert_eq!(api.check_key(&leaked).await, (401, json!("deleted_key")));
    assert_eq!(api.check_key(&replacement).await.0, 200);
    // The other leaked key is still there, and so is the notice about it.
    assert!(browser.displayed("leaks").await);
    assert_eq!(
        browser
            .script("return document.querySelectorAll('#leak-list li').length")
            .await,
        1
    );
    assert_eq!(browser.csp_violations().await, json!([]));

    // The operator, shown acme's keys, replaces the other one: the
    // replacement goes to acme.
    browser.click(None, "Sign out").await;
    sign_in(&browser, &proxy, admin).await;
    click_path(
        &browser,
        "//button[@aria-label='Show the keys of acme']",
        "Show keys of acme",
    )
    .await;
    let web_item = format!("//ul[@id='leak-list']/li[@data-hash='{web_hash}']");
    click_path(
        &browser,
        &format!("{web_item}//button[@aria-label='Create a replacement for key acme web']"),
        "Create a replacement for acme web",
    )
    .await;
    assert_eq!(
        browser.text("create-key-account").await,
        "New keys go to the account acme."
    );
    browser.click(Some("create-key"), "Create key").await;
    browser.wait_shown("new-key", true).await;
    let (_, list) = api
        .send(
            reqwest::Method::GET,
            "/api/v1/keys?include_disabled=true&account=acme",
            admin,
            None,
        )
        .await;
    let names: Vec<_> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|key| key["leak"].is_null())
        .map(|key| key["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"acme web"), "{list}");
    assert_eq!(browser.csp_violations().await, json!([]));
    browser.close().await;
}

/// The rows of the table body `tbody` as the page shows them: each row's
/// `data-id` (a generation) or `data-app` (an app) under `"id"`, and the
/// text of each cell under the last of its classes (`cost`, `requests`,
/// …); `"title"`, the app's name apart from its URL.
async fn usage_rows(browser: &Browser, tbody: &str) -> Vec<Value> {
    let script = format!(
        "return Array.from(document.querySelectorAll('#{tbody} > tr'), (row) => {{ \
           const cells = Object.fromEntries(Array.from(row.cells, (cell) => \
             [cell.classList[cell.classList.length - 1], cell.textContent])); \
           const title = row.querySelector('.title'); \
           return {{ ...cells, id: row.dataset.id || row.dataset.app, \
             title: title ? title.textContent : null }}; \
         }})"
    );
    browser.script(&script).await.as_array().unwrap().clone()
}

/// Clicks the usage sections' Refresh until the generations table shows
/// `count` rows; those rows.
async fn generations_until(browser: &Browser, count: usize) -> Vec<Value> {
    refreshing_until(browser, "generations", || async {
        let rows = usage_rows(browser, "generation-rows").await;
        if rows.len() == count {
            Ok(rows)
        } else {
            Err(format!(
                "the generations table never had {count} rows: {rows:?} (the message says {:?})",
                browser.text("message").await
            ))
        }
    })
    .await
}

/// Waits until the apps table shows what `check` wants of its rows; them.
async fn apps_until(browser: &Browser, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    refreshing_until(browser, "generations", || async {
        let rows = usage_rows(browser, "app-rows").await;
        if check(&rows) {
            Ok(rows)
        } else {
            Err(format!("the apps table never showed {what}: {rows:?}"))
        }
    })
    .await
}

/// An account's usage on the page, as its manager sees it: empty at
/// first, then the account's recent generations (newest first, with the
/// key's name, the model, the cost charged, the app) and its apps ranked
/// with their requests in each period; an app title that is markup stays
/// text. A deleted key's requests name it by its hash. The operator sees
/// the same once it shows the account.
///
/// Needs `GET /api/v1/generations` and `GET /api/v1/apps`.
#[tokio::test]
async fn the_account_sees_its_generations_and_apps_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    let manager = api.account_with_manager(admin, "acme").await;
    api.top_up(admin, "acme", 10.0).await;
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            &manager,
            Some(json!({"name": "acme bot"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let client = body["key"].as_str().unwrap().to_owned();
    let client_hash = body["data"]["hash"].as_str().unwrap().to_owned();
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    // Before any request, both sections say there is nothing yet.
    sign_in(&browser, &proxy, &manager).await;
    browser.wait_shown("no-generations", true).await;
    assert_eq!(browser.text("no-generations").await, "No generations yet.");
    assert!(browser.displayed("generations").await);
    browser.wait_shown("no-apps", true).await;
    assert_eq!(
        browser.text("no-apps").await,
        "No app has sent requests this period."
    );
    assert!(browser.displayed("apps").await);

    // An app whose title is markup, then two requests from Example Chat,
    // then one from no app at all.
    let markup = "<img src=x onerror=alert(1)>";
    let chat_app = [
        ("http-referer", "https://chat.example.com/"),
        ("x-title", "Example Chat"),
    ];
    let sent: [&[(&str, &str)]; 4] = [
        &[
            ("http-referer", "https://markup.example/"),
            ("x-title", markup),
        ],
        &chat_app,
        &chat_app,
        &[],
    ];
    let mut ids = Vec::new();
    for headers in sent {
        ids.push(api.chat_recorded(&client, headers).await);
    }

    // The page lists them, the newest first.
    let rows = generations_until(&browser, 4).await;
    let shown: Vec<&str> = rows.iter().map(|row| row["id"].as_str().unwrap()).collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(shown, newest_first);
    assert!(!browser.displayed("no-generations").await);
    let (_, records) = api
        .send(
            reqwest::Method::GET,
            "/api/v1/generations?account=acme",
            &manager,
            None,
        )
        .await;
    for (row, record) in rows.iter().zip(records["data"].as_array().unwrap()) {
        assert_eq!(row["id"], record["id"]);
        assert_eq!(row["key"], "acme bot", "{row}");
        assert_eq!(row["model"], PAID_MODEL, "{row}");
        assert_eq!(row["status"], "200", "{row}");
        assert_eq!(row["tokens-in"], record["tokens_prompt"].to_string());
        assert_eq!(row["tokens-out"], record["tokens_completion"].to_string());
        assert_eq!(row["api"], "Chat", "{row}");
        assert_eq!(
            row["tokens-cached"],
            record["native_tokens_cached"].to_string(),
            "{row}"
        );
        assert_eq!(
            row["tokens-reasoning"],
            record["native_tokens_reasoning"].to_string(),
            "{row}"
        );
        let cost: f64 = row["cost"].as_str().unwrap().parse().unwrap();
        let charged = record["total_cost"].as_f64().unwrap();
        assert!(
            charged > 0.0 && (cost - charged).abs() < 1e-6,
            "{row} {record}"
        );
    }
    let apps: Vec<&str> = rows
        .iter()
        .map(|row| row["app"].as_str().unwrap())
        .collect();
    assert_eq!(apps, ["–", "Example Chat", "Example Chat", markup]);
    // The markup is text: no element was made of it.
    assert_eq!(
        browser
            .script("return document.querySelectorAll('#generations img, #apps img').length")
            .await,
        0
    );

    // Your apps: Example Chat first (more tokens), with its two requests.
    let ranked = apps_until(&browser, "both apps", |rows| {
        rows.len() == 2 && rows[0]["requests"] == "2"
    })
    .await;
    let expect_ranking = |rows: &[Value]| {
        assert_eq!(rows[0]["rank"], "1");
        assert_eq!(rows[0]["id"], "chat.example.com");
        assert_eq!(rows[0]["title"], "Example Chat");
        assert_eq!(rows[0]["requests"], "2");
        let models = rows[0]["models"].as_str().unwrap();
        assert!(
            models.starts_with(&format!("{PAID_MODEL}: 2 requests, ")),
            "{models}"
        );
        assert_eq!(rows[1]["rank"], "2");
        assert_eq!(rows[1]["title"], markup, "the title shown as text");
        assert_eq!(rows[1]["requests"], "1");
        let models = rows[1]["models"].as_str().unwrap();
        assert!(
            models.starts_with(&format!("{PAID_MODEL}: 1 request, ")),
            "{models}"
        );
    };
    expect_ranking(&ranked);
    let link = browser
        .client
        .find(fantoccini::Locator::Css(
            "#app-rows tr[data-app='chat.example.com'] a",
        ))
        .await
        .unwrap();
    assert_eq!(
        link.attr("href").await.unwrap().as_deref(),
        Some("https://chat.example.com/")
    );
    assert_eq!(
        link.attr("rel").await.unwrap().as_deref(),
        Some("noopener noreferrer")
    );
    assert!(browser.text("app-caption").await.contains("today"));

    // The same apps this week and this month.
    for (period, words) in [("week", "this week"), ("month", "this month")] {
        browser.select("apps", "Period", period).await;
        browser
            .wait_for_text("app-caption", words, |text| text.contains(words))
            .await;
        let rows = apps_until(&browser, "both apps", |rows| rows.len() == 2).await;
        expect_ranking(&rows);
    }
    assert_eq!(
        browser
            .script("return document.querySelectorAll('#generations img, #apps img').length")
            .await,
        0
    );
    assert_eq!(browser.csp_violations().await, json!([]));

    // A deleted key's requests name it by the start of its hash.
    let (status, body) = api
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/keys/{client_hash}"),
            &manager,
            None,
        )
        .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    let prefix = format!("{}…", &client_hash[..12]);
    refreshing_until(&browser, "keys", || async {
        let rows = usage_rows(&browser, "generation-rows").await;
        if rows.len() == 4 && rows.iter().all(|row| row["key"] == prefix.as_str()) {
            Ok(())
        } else {
            Err(format!("{rows:?}"))
        }
    })
    .await;

    // The operator sees its own (empty) account first, then acme's.
    browser.click(None, "Sign out").await;
    browser.wait_shown("sign-in", true).await;
    assert!(!browser.displayed("generations").await);
    assert!(!browser.displayed("apps").await);
    sign_in(&browser, &proxy, admin).await;
    browser.wait_shown("no-generations", true).await;
    // Its own account's apps, not the whole gateway's (acme's are there).
    browser.wait_shown("no-apps", true).await;
    click_path(
        &browser,
        "//button[@aria-label='Show the keys of acme']",
        "Show keys of acme",
    )
    .await;
    browser
        .wait_for_text("generation-caption", "acme", |text| {
            text.contains("the account acme")
        })
        .await;
    let rows = generations_until(&browser, 4).await;
    let shown: Vec<&str> = rows.iter().map(|row| row["id"].as_str().unwrap()).collect();
    assert_eq!(shown, newest_first);
    apps_until(&browser, "acme's apps", |rows| {
        rows.len() == 2 && rows[0]["id"] == "chat.example.com"
    })
    .await;
    assert_eq!(browser.csp_violations().await, json!([]));
    browser.close().await;
}

/// The Activity section after requests on two paid models and a free
/// one: the chart has exactly one bar per UTC day and model that spent
/// credits (the free model has a table row, no bar), each titled with
/// both, and the table's rows are `GET /api/v1/activity`'s, which add up
/// to the generation records. Nothing breaks the page's CSP.
///
/// Needs `GET /api/v1/activity`.
#[tokio::test]
async fn the_activity_chart_has_a_bar_per_day_and_model_that_spent() {
    const OTHER_PAID: &str = "openai/gpt-4o-mini";
    const FREE: &str = "meta-llama/llama-3.1-8b-instruct:free";
    let page = OperatorPage::open().await;
    let (browser, api, admin) = (&page.browser, &page.api, page.admin.as_str());
    // Before any request: the section is there, and says it is empty.
    browser.wait_shown("no-activity", true).await;
    assert!(browser.displayed("activity").await);
    let (status, created) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            admin,
            Some(json!({"name": "bot"})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let client = created["key"].as_str().unwrap().to_owned();
    for model in [PAID_MODEL, OTHER_PAID, PAID_MODEL, FREE] {
        let body = json!({"model": model, "max_tokens": 16,
                          "messages": [{"role": "user", "content": "Hello"}]});
        let (status, answer) = api
            .send(
                reqwest::Method::POST,
                "/api/v1/chat/completions",
                &client,
                Some(body),
            )
            .await;
        assert_eq!(status, 200, "{model}: {answer}");
    }
    // Settled: the activity counts all four.
    let path = "/api/v1/activity?account=default";
    let activity = wait_for(PATIENCE, || async {
        let (status, activity) = api.send(reqwest::Method::GET, path, admin, None).await;
        assert_eq!(status, 200, "{activity}");
        let requests: u64 = activity["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["requests"].as_u64().unwrap())
            .sum();
        if requests == 4 {
            Ok(activity["data"].as_array().unwrap().clone())
        } else {
            Err(format!("never four requests: {activity}"))
        }
    })
    .await;
    let spent: std::collections::BTreeSet<(String, String)> = activity
        .iter()
        .filter(|row| row["usage"].as_f64().unwrap() > 0.0)
        .map(|row| {
            (
                row["date"].as_str().unwrap().to_owned(),
                row["model"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let models: std::collections::BTreeSet<&str> =
        spent.iter().map(|(_, model)| model.as_str()).collect();
    assert_eq!(
        models,
        [OTHER_PAID, PAID_MODEL].into(),
        "two models spent: {activity:?}"
    );
    assert!(
        activity
            .iter()
            .any(|row| row["model"] == FREE && row["usage"] == 0)
    );

    // The page, refreshed, shows the same rows in its table.
    let rows = refreshing_until(browser, "generations", || async {
        let rows = usage_rows(browser, "activity-rows").await;
        if rows.len() == activity.len() {
            Ok(rows)
        } else {
            Err(format!(
                "the activity table never had {} rows: {rows:?}",
                activity.len()
            ))
        }
    })
    .await;
    for (row, figures) in rows.iter().zip(&activity) {
        assert_eq!(row["date"], figures["date"], "{row}");
        assert_eq!(row["model"], figures["model"], "{row}");
        assert_eq!(row["requests"], figures["requests"].to_string(), "{row}");
        assert_eq!(
            row["tokens-in"],
            figures["prompt_tokens"].to_string(),
            "{row}"
        );
        assert_eq!(
            row["tokens-out"],
            figures["completion_tokens"].to_string(),
            "{row}"
        );
        assert_eq!(
            row["tokens-cached"],
            figures["cached_tokens"].to_string(),
            "{row}"
        );
        assert_eq!(
            row["tokens-reasoning"],
            figures["reasoning_tokens"].to_string(),
            "{row}"
        );
        let shown: f64 = row["usage"]
            .as_str()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap();
        assert!(
            (shown - figures["usage"].as_f64().unwrap()).abs() < 1e-6,
            "{row}"
        );
        assert_eq!(row["byok"], "0", "{row}");
    }
    assert!(!browser.displayed("no-activity").await);

    // The chart: exactly one bar per day and model that spent, each named.
    let bars = browser
        .script(
            "return Array.from(document.querySelectorAll('#activity-chart rect'), (bar) => ({ \
               date: bar.dataset.date, model: bar.dataset.model, \
               height: Number(bar.getAttribute('height')), \
               title: bar.querySelector('title') ? bar.querySelector('title').textContent : null }))",
        )
        .await;
    let bars = bars.as_array().unwrap();
    assert_eq!(bars.len(), spent.len(), "{bars:?}");
    let drawn: std::collections::BTreeSet<(String, String)> = bars
        .iter()
        .map(|bar| {
            (
                bar["date"].as_str().unwrap().to_owned(),
                bar["model"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(drawn, spent);
    for bar in bars {
        let title = bar["title"].as_str().unwrap();
        assert!(
            title.contains(bar["date"].as_str().unwrap())
                && title.contains(bar["model"].as_str().unwrap()),
            "{bar}"
        );
        assert!(bar["height"].as_f64().unwrap() >= 1.0, "{bar}");
    }
    // The legend names the two that spent; the chart is an image named for
    // screen readers, which read the table.
    let legend = browser.text("activity-legend").await;
    assert!(
        legend.contains(PAID_MODEL) && legend.contains(OTHER_PAID) && !legend.contains(FREE),
        "{legend}"
    );
    let label = browser
        .by_id("activity-chart")
        .await
        .attr("aria-label")
        .await
        .unwrap()
        .unwrap();
    assert!(label.contains("table"), "{label}");
    // A picture of the section, beside the page's, for a person to look at.
    let picture = browser.by_id("activity").await.screenshot().await.unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("settings-activity.png");
    std::fs::write(path, picture).unwrap();
    assert_eq!(browser.csp_violations().await, json!([]));
    page.close().await;
}

/// The operator sees every account, creates one, tops it up and makes its
/// management key, all on the page; that key then signs in to its account.
///
/// Needs the accounts API: `GET`/`POST /api/v1/accounts`,
/// `GET /api/v1/accounts/{id}`, `GET /api/v1/keys?account=`, `operator`
/// and `account` in `GET /api/v1/key`, `management` in `POST /api/v1/keys`.
#[tokio::test]
async fn the_operator_manages_accounts_on_the_page() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let api = Api::new(&proxy);
    let driver = Chromedriver::start();
    let browser = driver.browser().await;

    sign_in(&browser, &proxy, admin).await;
    browser.wait_shown("accounts", true).await;
    // The operator's own account is listed; the form opens on demand.
    assert!(
        browser.text("account-rows").await.contains("default"),
        "{}",
        browser.text("account-rows").await
    );
    browser
        .client
        .find(fantoccini::Locator::XPath(
            "//summary[normalize-space()='Create an account']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.fill("accounts", "Account ID", "globex").await;
    browser.fill("accounts", "Account name", "Globex").await;
    browser.fill("accounts", "Email", "it@globex.example").await;
    browser.click(Some("accounts"), "Create account").await;
    browser
        .wait_for_text("message", "the new account", |text| {
            text.contains("Created the account globex")
        })
        .await;
    let (status, body) = api
        .send(reqwest::Method::GET, "/api/v1/accounts/globex", admin, None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["email"], "it@globex.example");

    // Top up 20 credits from the account's row.
    let row = "//tbody[@id='account-rows']/tr[td[normalize-space()='globex']]";
    let amount = browser
        .client
        .find(fantoccini::Locator::XPath(&format!(
            "{row}//input[@aria-label='Credits to add to globex']"
        )))
        .await
        .unwrap();
    amount.send_keys("20").await.unwrap();
    click_path(
        &browser,
        &format!("{row}//button[normalize-space()='Top up']"),
        "Top up button",
    )
    .await;
    browser
        .wait_for_text("message", "the top-up", |text| {
            text.contains("Added 20 credits to globex")
        })
        .await;
    let (_, body) = api
        .send(reqwest::Method::GET, "/api/v1/accounts/globex", admin, None)
        .await;
    assert_eq!(body["data"]["balance"], 20);

    // Its keys, and a management key for it.
    click_path(
        &browser,
        &format!("{row}//button[@aria-label='Show the keys of globex']"),
        "Show the keys of globex",
    )
    .await;
    browser
        .wait_for_text("account-title", "globex", |text| text.contains("globex"))
        .await;
    browser
        .wait_for_text("account-balance", "its balance", |text| {
            text == "20 credits"
        })
        .await;
    browser.fill("create-key", "Name", "globex manager").await;
    browser
        .field("create-key", "Account management key")
        .await
        .click()
        .await
        .unwrap();
    let manager = create_on_page(&browser).await;
    let (status, me) = api
        .send(reqwest::Method::GET, "/api/v1/key", &manager, None)
        .await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["data"]["management"], true);
    assert_eq!(me["data"]["account"], "globex");
    assert_eq!(me["data"]["operator"], false);

    // That key signs in to globex alone.
    browser.click(None, "Sign out").await;
    sign_in(&browser, &proxy, &manager).await;
    assert!(!browser.displayed("accounts").await);
    browser
        .wait_for_text("account-balance", "globex's balance", |text| {
            text == "20 credits"
        })
        .await;
    wait_for_cell(&browser, "globex manager", "name", "its row", |text| {
        text.is_some()
    })
    .await;
    browser.close().await;
}

/// A wrong key, a malformed one and an inference key are each told
/// clearly why they cannot sign in; none is kept.
#[tokio::test]
async fn a_wrong_key_or_an_inference_key_gets_a_clear_message() {
    let _one_browser = BROWSER.lock().await;
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let inference = proxy.create_key(admin, "app").await;
    let driver = Chromedriver::start();
    let browser = driver.browser().await;
    browser.goto(&format!("{}/settings", proxy.address)).await;

    let unknown = ApiKey::generate();
    for (key, expected) in [
        (unknown.expose(), "unknown API key"),
        (
            "sk-not-a-modelgate-key",
            "modelgate keys start with `mg-v1-`",
        ),
        (inference.as_str(), "This is an inference key"),
    ] {
        browser.fill("sign-in", "Management key", key).await;
        browser.click(Some("sign-in"), "Sign in").await;
        browser
            .wait_for_text("message", expected, |text| {
                text.starts_with("Sign-in failed: ") && text.contains(expected)
            })
            .await;
        let class = browser.by_id("message").await.attr("class").await.unwrap();
        assert_eq!(class.as_deref(), Some("message error"));
        assert!(!browser.displayed("keys").await);
        assert!(browser.displayed("sign-in").await);
        assert_eq!(browser.script("return sessionStorage.length").await, 0);
    }
    let message = browser.text("message").await;
    assert!(message.contains("management key"), "{message}");
    browser.close().await;
}

/// Every page response carries the security headers; other files under
/// /settings are canonical 404s, other methods 405s.
#[tokio::test]
async fn the_page_is_served_with_its_security_headers() {
    let admin = ApiKey::generate();
    let proxy = start_proxy(admin.expose());
    let http = reqwest::Client::new();
    for (path, content_type) in [
        ("/settings", "text/html; charset=utf-8"),
        ("/settings/", "text/html; charset=utf-8"),
        ("/settings/app.js", "text/javascript; charset=utf-8"),
        ("/settings/activity.js", "text/javascript; charset=utf-8"),
        ("/settings/app.css", "text/css; charset=utf-8"),
        ("/settings/icon.svg", "image/svg+xml; charset=utf-8"),
    ] {
        for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
            let response = http
                .request(method.clone(), format!("{}{path}", proxy.address))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{method} {path}");
            let headers = response.headers();
            assert_eq!(headers["content-type"], content_type, "{path}");
            assert_eq!(headers["content-security-policy"], CONTENT_SECURITY_POLICY);
            assert_eq!(headers["x-content-type-options"], "nosniff");
            assert_eq!(headers["referrer-policy"], "no-referrer");
            assert_eq!(headers["cache-control"], "no-store");
            assert!(!headers.contains_key("access-control-allow-origin"));
            assert!(!headers.contains_key("set-cookie"));
            let body = response.bytes().await.unwrap();
            if method == reqwest::Method::HEAD {
                assert!(body.is_empty());
            } else {
                assert!(!body.is_empty());
            }
        }
    }
    let response = http
        .post(format!("{}/settings", proxy.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET, HEAD");
    assert_eq!(
        response.headers()["content-security-policy"],
        CONTENT_SECURITY_POLICY
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "method_not_allowed");

    let response = http
        .get(format!("{}/settings/secrets.txt", proxy.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
    assert_eq!(body["error"]["code"], 404);
}

/// No other origin may call the API from a browser: neither a preflight
/// nor an answer carries an Access-Control-Allow-Origin.
#[tokio::test]
async fn the_api_allows_no_other_origin() {
    let admin = ApiKey::generate();
    let admin = admin.expose();
    let proxy = start_proxy(admin);
    let http = reqwest::Client::new();
    for path in [
        "/api/v1/keys",
        "/api/v1/key",
        "/api/v1/chat/completions",
        "/settings",
    ] {
        let preflight = http
            .request(reqwest::Method::OPTIONS, format!("{}{path}", proxy.address))
            .header("origin", "https://elsewhere.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
            .await
            .unwrap();
        assert!(
            !preflight.status().is_success(),
            "OPTIONS {path}: {}",
            preflight.status()
        );
        for header in preflight.headers().keys() {
            assert!(
                !header.as_str().starts_with("access-control-"),
                "OPTIONS {path} answers {header}"
            );
        }
    }
    // A request with a good key from another origin: answered (a browser
    // would not let the page read it), with no CORS allowance.
    let answer = http
        .get(format!("{}/api/v1/keys", proxy.address))
        .header("origin", "https://elsewhere.example")
        .bearer_auth(admin)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    for header in answer.headers().keys() {
        assert!(!header.as_str().starts_with("access-control-"), "{header}");
    }
}

/// Resizes the window until the page's viewport is `width` px wide (the
/// window's frame, if any, added).
async fn viewport_width(browser: &Browser, width: u32) {
    browser.client.set_window_size(width, 900).await.unwrap();
    let inner = browser.script("return window.innerWidth").await;
    let frame = 900u32.min(u32::try_from(width as i64 - inner.as_i64().unwrap()).unwrap_or(0));
    if frame > 0 {
        browser
            .client
            .set_window_size(width + frame, 900)
            .await
            .unwrap();
    }
    browser.settled().await;
    assert_eq!(
        browser.script("return window.innerWidth").await,
        width,
        "the viewport"
    );
}

/// What at the window's width is wider than where it is shown: the page
/// itself, each table's container, the Rotate buttons (clipped when past
/// the window's or their container's right edge), a model of a key's list
/// broken within its name, a key's dates on more than a line each.
const OVERFLOWS: &str = r#"
const found = [];
const over = (element, what) => {
  if (element.scrollWidth > element.clientWidth + 1) {
    found.push(what + ' is ' + element.scrollWidth + ' px wide in ' + element.clientWidth + ' px');
  }
};
over(document.documentElement, 'the page');
over(document.body, 'the body');
for (const wrap of document.querySelectorAll('.table-wrap')) {
  if (wrap.offsetParent !== null) over(wrap, 'the table #' + wrap.querySelector('table').id);
}
for (const button of document.querySelectorAll('#key-rows button')) {
  const box = button.getBoundingClientRect();
  const wrap = button.closest('.table-wrap').getBoundingClientRect();
  if (box.right > Math.min(window.innerWidth, wrap.right) + 1 || box.left < wrap.left - 1) {
    found.push(button.getAttribute('aria-label') + ' is cut off at ' + box.left + '..' + box.right);
  }
}
for (const item of document.querySelectorAll('#key-rows .models .item, #key-rows .rate .item')) {
  const line = parseFloat(getComputedStyle(item).lineHeight);
  if (item.getBoundingClientRect().height > line * 1.5) {
    found.push('"' + item.textContent + '" is broken within');
  }
}
for (const line of document.querySelectorAll('#key-rows .dates .line')) {
  const height = parseFloat(getComputedStyle(line).lineHeight);
  if (line.getBoundingClientRect().height > height * 2.5) {
    found.push('"' + line.textContent + '" takes more than two lines');
  }
}
return found;
"#;

/// The page at the widths people use, with keys that have long names,
/// model lists and rates, used (so dates and generations show) and the
/// operator's Account column: nothing wider than the window at 1400 and
/// 1024 px; at 800 px every table stacked, a card per row, still nothing
/// wider. Fails on the page before it was fitted (a table 1,500 px wide
/// in 1,100). Writes a picture of each width to `target/tmp`.
#[tokio::test]
async fn the_page_fits_the_window_at_1400_1024_and_800_px() {
    let page = OperatorPage::open().await;
    let (browser, api, admin) = (&page.browser, &page.api, page.admin.as_str());
    for (name, models, rate) in [
        (
            "Production chatbot for the customer support team",
            json!([
                "demo/paid",
                "openai/gpt-4o-mini",
                "meta-llama/llama-3.1-8b-instruct:free",
                "anthropic/"
            ]),
            json!({"requests": 600, "window_seconds": 60}),
        ),
        (
            "batch",
            json!(["demo/", "mistralai/mistral-small-3.2-24b-instruct"]),
            json!({"requests": 10000, "window_seconds": 86400}),
        ),
    ] {
        let (status, created) = api
            .send(
                reqwest::Method::POST,
                "/api/v1/keys",
                admin,
                Some(json!({"name": name, "limit": 5, "limit_reset": "monthly",
                            "expires_at": "2099-06-01T12:00:00Z",
                            "allowed_models": models, "rate_limit": rate})),
            )
            .await;
        assert_eq!(status, 201, "{created}");
        let key = created["key"].as_str().unwrap().to_owned();
        for _ in 0..2 {
            let (status, body) = api.chat(&key).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    refresh_until(
        browser,
        "Production chatbot for the customer support team",
        "last-used",
        "its last use",
        |text| text != "never",
    )
    .await;
    generations_until(browser, 4).await;
    for width in [1400, 1024, 800, 480] {
        viewport_width(browser, width).await;
        let found = browser.script(OVERFLOWS).await;
        let picture = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("settings-page-{width}.png"));
        browser.screenshot(&picture).await;
        assert_eq!(found, json!([]), "at {width} px");
        let stacked = browser
            .script("return getComputedStyle(document.querySelector('#key-rows > tr')).display")
            .await;
        assert_eq!(
            stacked,
            if width <= 800 { "block" } else { "table-row" },
            "at {width} px"
        );
        if width <= 800 {
            // Each value under its column's name.
            let label = browser
                .script(
                    "return getComputedStyle(document.querySelector('#key-rows td.limit'), '::before').content",
                )
                .await;
            assert_eq!(label, "\"Limit\"", "at {width} px");
        }
    }
    // One date format: every moment shown is UTC, ISO-like.
    let moments = browser
        .script("return Array.from(document.querySelectorAll('time'), (time) => time.textContent)")
        .await;
    let moments = moments.as_array().unwrap();
    assert!(moments.len() >= 6, "{moments:?}");
    for moment in moments {
        let text = moment.as_str().unwrap();
        let shaped = text.len() >= 20
            && text.ends_with(" UTC")
            && text.as_bytes()[4] == b'-'
            && text.as_bytes()[7] == b'-'
            && text.as_bytes()[10] == b' '
            && text.as_bytes()[13] == b':';
        assert!(shaped, "{text:?}");
    }
    assert_eq!(browser.csp_violations().await, json!([]));
    page.close().await;
}

/// The page's formatting, run in the page itself: every time in UTC,
/// ISO-like, and the Expires fields read and written in UTC.
#[tokio::test]
async fn times_are_written_one_way_in_utc() {
    let page = OperatorPage::open().await;
    let formatted = page
        .browser
        .script(
            "const { utcText, utcDay, utcInput, expiresField } = globalThis.modelgateApi; \
             const field = document.createElement('input'); field.value = '2099-06-01T12:00'; \
             const empty = document.createElement('input'); \
             return [utcText('2026-11-29T07:45:59.999Z'), utcText('2026-11-29T08:45:12+01:00', true), \
                     utcText(null), utcText('not a time'), utcDay('2026-11-29T23:59:59-01:00'), \
                     utcInput('2099-06-01T12:00:00Z'), expiresField(field), expiresField(empty)]",
        )
        .await;
    assert_eq!(
        formatted,
        json!([
            "2026-11-29 07:45 UTC",
            "2026-11-29 07:45:12 UTC",
            "–",
            "–",
            "2026-11-30",
            "2099-06-01T12:00",
            "2099-06-01T12:00:00.000Z",
            null
        ])
    );
    page.close().await;
}

/// A request whose instance died mid-way: its hold lapses and is charged
/// whole; the page shows it under the model it asked for, marked lapsed,
/// with why in words, in the generations and the activity tables.
#[tokio::test]
async fn a_lapsed_request_shows_on_the_page_under_its_model_and_says_why() {
    use modelgate::store::{
        LedgerStore, NANOS_PER_CREDIT, RecordKeeping, ReserveRequest, SqliteStore,
        SqliteStoreConfig,
    };
    let _one_browser = BROWSER.lock().await;
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("gateway.db");
    let admin = ApiKey::generate().expose().to_owned();
    let mut command = Command::new(common::examples::binary("proxy"));
    command
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!("sqlite:{}", file.display()))
        .env("MODELGATE_ADMIN_KEY", &admin)
        .env("RUST_LOG", "warn");
    let proxy = ProxyProcess::spawn(command);
    let api = Api::new(&proxy);
    api.top_up(&admin, "default", 10.0).await;
    let (status, created) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            &admin,
            Some(json!({"name": "bot"})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let client_hash = modelgate::auth::KeyHash::of(created["key"].as_str().unwrap()).to_hex();
    // Another instance on the same file admits a request and dies: its
    // hold, never renewed, lapses a second later.
    let other_instance = SqliteStore::open(&file, SqliteStoreConfig::default()).unwrap();
    let held = 134 * NANOS_PER_CREDIT / 1000;
    let hold = ReserveRequest {
        account: "default".into(),
        key: client_hash.clone(),
        reservation_id: format!("{:032x}", 42),
        amount_nanos: held,
        min_amount_nanos: None,
        key_limit: None,
        counts_against_key_limit: true,
        check_balance: true,
        covered_by_balance: true,
        ttl: Duration::from_secs(1),
        lapse_record: Some(RecordKeeping {
            retention: Duration::from_secs(86_400),
            max_per_account: 1000,
            model: Some(PAID_MODEL.to_owned()),
        }),
    };
    let admitted = other_instance
        .reserve(&hold, chrono::Utc::now())
        .await
        .unwrap();
    assert!(admitted.is_reserved(), "{admitted:?}");
    drop(other_instance);
    // The first call on the account past the hold's life charges it.
    let path = format!("/api/v1/keys/{client_hash}");
    wait_until(PATIENCE, "the lapse charged to the key", || async {
        let (status, key) = api.send(reqwest::Method::GET, &path, &admin, None).await;
        status == 200 && key["data"]["usage"] == json!(0.134)
    })
    .await;

    let driver = Chromedriver::start();
    let browser = driver.browser().await;
    sign_in(&browser, &proxy, &admin).await;
    browser.watch_csp().await;
    let rows = generations_until(&browser, 1).await;
    let row = &rows[0];
    assert!(row["model"].as_str().unwrap().contains(PAID_MODEL), "{row}");
    assert_eq!(row["cost"], "0.134", "{row}");
    let marks = row["marks"].as_str().unwrap();
    assert!(marks.contains("lapsed"), "{row}");
    assert!(marks.contains("Charged its whole hold"), "{row}");
    let activity = refreshing_until(&browser, "generations", || async {
        let rows = usage_rows(&browser, "activity-rows").await;
        match rows.as_slice() {
            [row] => Ok(row.clone()),
            other => Err(format!("the activity table never had one row: {other:?}")),
        }
    })
    .await;
    let model = activity["model"].as_str().unwrap();
    assert!(model.starts_with(PAID_MODEL), "{activity}");
    assert!(
        model.contains("1 request charged whole holds (0.134 credits): usage never known"),
        "{activity}"
    );
    assert_eq!(activity["requests"], "1", "{activity}");
    assert!(
        browser
            .text("activity-caption")
            .await
            .contains("charged their whole hold, their usage never known"),
        "the caption says why"
    );
    assert_eq!(browser.csp_violations().await, json!([]));
    browser.close().await;
}
