//! A real browser for tests: Debian's `chromedriver` on a loopback port,
//! driving headless Chromium with a fresh profile, through fantoccini.
//!
//! A missing `chromium` or `chromedriver` fails the test with the command
//! that installs them, never a skip. Everything started here (chromedriver
//! and the Chromium it starts) runs in a process group of its own, killed
//! by its id when the handle drops, so a failed test leaves no browser
//! behind.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use super::wait::wait_for;

const INSTALL_HINT: &str = "is not on PATH. Run the README's test command, `./scripts/test.sh`, \
which installs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver).";

/// How long the page may take to show what a step waits for.
pub const PATIENCE: Duration = Duration::from_secs(15);

fn program(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{name} {INSTALL_HINT}"))
}

/// `chromedriver` on a loopback port it chose itself (`--port=0`, read
/// back from what it prints, so no other process can take the port in
/// between).
pub struct Chromedriver {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Chromedriver {
    pub fn start() -> Chromedriver {
        let mut child = Command::new(program("chromedriver"))
            .args(["--port=0", "--allowed-ips=127.0.0.1", "--log-level=WARNING"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own group: Chromium, its child, is killed with it.
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("chromedriver exited before saying its port");
            };
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').trim().parse::<u16>().unwrap();
            }
        };
        // Drained as it comes: a full pipe would stall it.
        std::thread::spawn(move || for _ in lines {});
        Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// A new headless Chromium with a profile of its own.
    pub async fn browser(&self) -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": program("chromium"),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    // Nothing but the loopback pages under test: Chromium
                    // otherwise reaches for Google's hosts at every start
                    // (updates, sync, field trials, its DNS probes), which a
                    // machine without internet answers with failed lookups
                    // and refused connections, many at a time.
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-quic",
                    "--disable-default-apps",
                    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        // Plain HTTP to chromedriver on loopback: no TLS needed.
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("chromedriver starts a Chromium session");
        Browser {
            client,
            _profile: profile,
        }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // The whole group, by its id (the group leader's pid).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// One Chromium session. Call [`close`](Self::close) at the end of a test;
/// a test that panics leaves it to [`Chromedriver`]'s drop.
pub struct Browser {
    pub client: Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn close(self) {
        let _ = self.client.close().await;
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    pub async fn by_id(&self, id: &str) -> Element {
        self.client.find(Locator::Id(id)).await.unwrap()
    }

    /// The visible button whose text is exactly `text`, inside `scope` (a
    /// CSS id without `#`, or `None` for the whole page).
    pub async fn button(&self, scope: Option<&str>, text: &str) -> Element {
        let prefix = scope.map_or(String::new(), |id| format!("//*[@id='{id}']"));
        let xpath = format!("{prefix}//button[normalize-space()='{text}']");
        wait_for(PATIENCE, || async {
            for button in self.client.find_all(Locator::XPath(&xpath)).await.unwrap() {
                if button.is_displayed().await.unwrap_or(false) {
                    return Ok(button);
                }
            }
            Err(format!("no visible button {text:?} in {scope:?}"))
        })
        .await
    }

    pub async fn click(&self, scope: Option<&str>, text: &str) {
        self.button(scope, text).await.click().await.unwrap();
    }

    /// The control the `<label for>` whose text is exactly `label` names,
    /// inside the element `scope`: found as a person or a screen reader
    /// finds it, so a label not bound to its input fails here.
    pub async fn field(&self, scope: &str, label: &str) -> Element {
        let xpath = format!("//*[@id='{scope}']//label[normalize-space()='{label}']");
        let label_element = self
            .client
            .find(Locator::XPath(&xpath))
            .await
            .unwrap_or_else(|_| panic!("no label {label:?} in #{scope}"));
        let target = label_element
            .attr("for")
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the label {label:?} names no control"));
        self.by_id(&target).await
    }

    /// Types `text` into the field labelled `label`, replacing its value.
    pub async fn fill(&self, scope: &str, label: &str, text: &str) {
        let field = self.field(scope, label).await;
        field.clear().await.unwrap();
        if !text.is_empty() {
            field.send_keys(text).await.unwrap();
        }
    }

    /// Picks the option whose value is `value` in the select labelled `label`.
    pub async fn select(&self, scope: &str, label: &str, value: &str) {
        self.field(scope, label)
            .await
            .select_by_value(value)
            .await
            .unwrap();
    }

    pub async fn text(&self, id: &str) -> String {
        self.by_id(id).await.text().await.unwrap()
    }

    pub async fn displayed(&self, id: &str) -> bool {
        self.by_id(id).await.is_displayed().await.unwrap()
    }

    /// Waits until `check` holds of the text of the element `id`; that text.
    pub async fn wait_for_text(
        &self,
        id: &str,
        what: &str,
        check: impl Fn(&str) -> bool,
    ) -> String {
        wait_for(PATIENCE, || async {
            let text = self.text(id).await;
            if check(&text) {
                Ok(text)
            } else {
                Err(format!("#{id} never showed {what}; it shows {text:?}"))
            }
        })
        .await
    }

    /// Waits until the element `id` is shown (or hidden, when `shown` is false).
    pub async fn wait_shown(&self, id: &str, shown: bool) {
        wait_for(PATIENCE, || async {
            if self.displayed(id).await == shown {
                Ok(())
            } else {
                Err(format!(
                    "#{id} is still {} (the message says {:?})",
                    if shown { "hidden" } else { "shown" },
                    self.text("message").await
                ))
            }
        })
        .await
    }

    /// Waits until the page has run what is queued now: the tasks an event
    /// (a click) queued, and the next frame's drawing. What a click does
    /// in the page, it has done by then.
    pub async fn settled(&self) {
        self.client
            .execute_async(
                "const done = arguments[arguments.length - 1]; \
                 requestAnimationFrame(() => setTimeout(done, 0));",
                Vec::new(),
            )
            .await
            .unwrap();
    }

    /// Runs `script` in the page; its JSON result.
    pub async fn script(&self, script: &str) -> Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    /// Records from now on what the page's Content-Security-Policy blocks
    /// (an inline style or script the page adds as it runs, say); read by
    /// [`csp_violations`](Self::csp_violations). A reload forgets it.
    pub async fn watch_csp(&self) {
        self.script(
            "window.cspViolations = []; \
             document.addEventListener('securitypolicyviolation', (event) => \
               window.cspViolations.push(event.violatedDirective + ' ' + event.blockedURI));",
        )
        .await;
    }

    /// What the policy blocked since [`watch_csp`](Self::watch_csp).
    pub async fn csp_violations(&self) -> Value {
        self.script("return window.cspViolations").await
    }

    /// A PNG of the top of the page, written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        self.script("document.activeElement.blur(); window.scrollTo(0, 0);")
            .await;
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}
