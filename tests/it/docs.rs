//! The user documentation (README.md and docs/*.md) checked against the
//! code, so it cannot drift:
//!
//! - Every ```` ```sh ```` block of a page runs, in order, in one bash
//!   (`set -euo pipefail`) against a fresh proxy example started for that
//!   page. `ADMIN` (the management key it printed), `GW`
//!   (`http://ADDR/api/v1`), `HOST` (`http://ADDR`) and `OPS` (its admin
//!   listener) are set. A block marked ```` ```sh untested ```` is shown,
//!   not run: the set-up commands, and what needs a real upstream.
//! - A ```` ```text output ```` block right after a shell block is what
//!   that block prints; `…` stands for any text within a line, and a line
//!   that is only `…` for any number of lines.
//! - A ```` ```python ```` block runs in the same shell when the `openai`
//!   package is installed (it never is installed for the tests).
//! - A ```` ```json ```` block parses as JSON; ```` ```json config ````
//!   is a configuration `GatewayConfig::from_json` accepts, and
//!   ```` ```json file=NAME ```` is written to the shell's directory (the
//!   page's proxy reads `file=gateway.json` as its `--config`).
//! - docs/errors.md names every error type, status, `limit_source`,
//!   `metadata.reason`, metadata field and webhook code the source uses;
//!   docs/configuration.md every config section and command-line flag;
//!   docs/routes.md every route; links between the pages resolve.

use crate::common::examples;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use modelgate::error::ErrorKind;
use modelgate::proxy::GatewayConfig;

/// The pages, relative to the crate root.
const PAGES: [&str; 6] = [
    "README.md",
    "docs/routes.md",
    "docs/configuration.md",
    "docs/errors.md",
    "docs/operating.md",
    "docs/security.md",
];

/// The secret the webhook route of docs/routes.md reads from the
/// environment, as its config says.
const WEBHOOK_SECRET: (&str, &str) = ("DEPLOY_HOOK_SECRET", "docs-test-secret-0123456789abcdef");

/// The longest a page's shell blocks may run together.
const PAGE_TIMEOUT_SECONDS: u64 = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|error| panic!("{page}: {error}"))
}

/// A fenced code block: its info string, its text and the line it starts on.
#[derive(Clone, Debug)]
struct Block {
    info: String,
    text: String,
    line: usize,
}

impl Block {
    fn language(&self) -> &str {
        self.info.split([' ', ',']).next().unwrap_or_default()
    }

    fn has(&self, word: &str) -> bool {
        self.info.split([' ', ',']).any(|part| part == word)
    }

    fn file_name(&self) -> Option<&str> {
        self.info
            .split(' ')
            .find_map(|part| part.strip_prefix("file="))
    }

    fn is_output(&self) -> bool {
        self.language() == "text" && self.has("output")
    }
}

/// Every fenced block of `markdown`, in order.
fn blocks(markdown: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in markdown.lines().enumerate() {
        match &mut open {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some(Block {
                        info: info.trim().to_owned(),
                        text: String::new(),
                        line: index + 1,
                    });
                }
            }
            Some(block) => {
                if line.trim_end() == "```" {
                    found.push(open.take().unwrap());
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    found
}

/// Whether `actual` matches `expected`, where `…` in a line stands for any
/// text and a line that is only `…` for any number of lines.
fn output_matches(expected: &str, actual: &str) -> bool {
    let expected: Vec<&str> = expected.lines().collect();
    let actual: Vec<&str> = actual.lines().collect();
    lines_match(&expected, &actual)
}

fn lines_match(expected: &[&str], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first.trim() == "…" => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => match actual.split_first() {
            Some((line, actual_rest)) => {
                line_matches(first, line) && lines_match(rest, actual_rest)
            }
            None => false,
        },
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split('…').collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The proxy example running for one page, with what it printed.
struct Proxy {
    child: std::process::Child,
    admin_key: String,
    address: String,
    ops: String,
}

impl Proxy {
    /// Starts the proxy on free ports, with no management key given, so
    /// that it prints one, as the README's quick start says.
    /// It runs in `directory` (the page's own), where it keeps its state
    /// as the README's quick start does: `modelgate.db`, its default store,
    /// which the page's `sqlite3` examples read.
    fn start(config: Option<&Path>, log: &Path, directory: &Path) -> Proxy {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(examples::binary("proxy"));
        command
            .current_dir(directory)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env_remove("MODELGATE_ADMIN_KEY")
            .env(WEBHOOK_SECRET.0, WEBHOOK_SECRET.1)
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap());
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command.spawn().expect("the proxy example starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = |prefix: &str| {
            let line = lines
                .next()
                .unwrap_or_else(|| {
                    panic!(
                        "the proxy stopped before printing {prefix:?}: {}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    )
                })
                .unwrap();
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected {prefix:?}, the proxy printed {line:?}"))
                .to_owned()
        };
        // The order the README's quick start shows.
        let admin_key = next("operator key (shown once): ");
        let address = next("modelgate listening on ");
        let ops = next("admin (metrics, healthz, readyz) on ");
        std::thread::spawn(move || for _ in lines {});
        Proxy {
            child,
            admin_key,
            address,
            ops,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openai_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// One step of a page's script: a block to run and the output it must print.
struct Step {
    block: Block,
    expected: Option<Block>,
}

/// Runs the shell (and, with `openai`, python) blocks of `page` against a
/// proxy of its own; panics naming the page and block that failed.
fn run_page(page: &str) {
    let markdown = read(page);
    let all = blocks(&markdown);
    let dir = tempfile::tempdir().unwrap();
    let mut config = None;
    for block in &all {
        if let Some(name) = block.file_name() {
            let path = dir.path().join(name);
            std::fs::write(&path, &block.text).unwrap();
            if name == "gateway.json" {
                config = Some(path);
            }
        }
    }
    let python = openai_installed();
    let mut steps = Vec::new();
    for (index, block) in all.iter().enumerate() {
        let runs = match block.language() {
            "sh" => !block.has("untested"),
            "python" => python && !block.has("untested"),
            _ => false,
        };
        let expected = all.get(index + 1).filter(|next| next.is_output()).cloned();
        if runs {
            steps.push(Step {
                block: block.clone(),
                expected,
            });
        } else {
            assert!(
                expected.is_none(),
                "{page}:{}: an output block follows a block that does not run",
                block.line
            );
        }
    }
    if steps.is_empty() {
        return;
    }

    // Each step's output is told apart by the size of the output file
    // when it starts: exact, whether or not a block ends its last line.
    let out_path = dir.path().join("stdout.txt");
    let marks_path = dir.path().join("marks.txt");
    let mut script = String::from(
        "set -euo pipefail\nexec >\"$DOCS_OUT\"\n__docs_mark() { stat -c %s \"$DOCS_OUT\" >>\"$DOCS_MARKS\"; }\n",
    );
    for step in &steps {
        script.push_str("__docs_mark\n");
        match step.block.language() {
            "python" => {
                script.push_str("python3 - <<'__DOCS_PYTHON__'\n");
                script.push_str(&step.block.text);
                script.push_str("__DOCS_PYTHON__\n");
            }
            _ => script.push_str(&step.block.text),
        }
    }
    script.push_str("__docs_mark\n");
    let script_path = dir.path().join("page.sh");
    std::fs::File::create(&script_path)
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();

    let log = dir.path().join("proxy.log");
    let proxy = Proxy::start(config.as_deref(), &log, dir.path());
    let output = Command::new("timeout")
        .arg(PAGE_TIMEOUT_SECONDS.to_string())
        .arg("bash")
        .arg(&script_path)
        .current_dir(dir.path())
        .env("DOCS_OUT", &out_path)
        .env("DOCS_MARKS", &marks_path)
        .env("ADMIN", &proxy.admin_key)
        .env("GW", format!("{}/api/v1", proxy.address))
        .env("HOST", &proxy.address)
        .env("OPS", &proxy.ops)
        .env("MODELGATE_BASE_URL", format!("{}/api/v1", proxy.address))
        .env(WEBHOOK_SECRET.0, WEBHOOK_SECRET.1)
        .output()
        .expect("bash runs");
    drop(proxy);
    let stdout = std::fs::read(&out_path).unwrap_or_default();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let marks: Vec<usize> = std::fs::read_to_string(&marks_path)
        .unwrap_or_default()
        .lines()
        .map(|mark| mark.trim().parse().unwrap())
        .collect();

    // What each step printed, between its mark and the next (or the end).
    let printed: Vec<String> = (0..marks.len().min(steps.len()))
        .map(|index| {
            let start = marks[index];
            let end = marks.get(index + 1).copied().unwrap_or(stdout.len());
            String::from_utf8_lossy(&stdout[start..end.max(start)]).into_owned()
        })
        .collect();
    let ended = marks.len() == steps.len() + 1;
    let describe = |index: usize| {
        let step = &steps[index];
        format!(
            "{page}:{} (block {} of the page's {} run)\n---\n{}---\nit printed:\n{}\nstderr:\n{stderr}\nproxy log (tail):\n{}",
            step.block.line,
            index + 1,
            steps.len(),
            step.block.text,
            printed.get(index).map(String::as_str).unwrap_or(""),
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20),
        )
    };
    if !output.status.success() || !ended {
        let failed = printed.len().saturating_sub(1);
        panic!(
            "a command failed ({}) in {}",
            output.status,
            describe(failed)
        );
    }
    let mut mismatches = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        if let Some(expected) = &step.expected
            && !output_matches(&expected.text, &printed[index])
        {
            mismatches.push(format!(
                "the output shown at {page}:{} is not what the command prints: {}\nexpected:\n{}",
                expected.line,
                describe(index),
                expected.text
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn readme_commands_run_as_shown() {
    run_page("README.md");
}

#[test]
fn routes_commands_run_as_shown() {
    run_page("docs/routes.md");
}

#[test]
fn configuration_commands_run_as_shown() {
    run_page("docs/configuration.md");
}

#[test]
fn errors_commands_run_as_shown() {
    run_page("docs/errors.md");
}

#[test]
fn operating_commands_run_as_shown() {
    run_page("docs/operating.md");
}

#[test]
fn security_commands_run_as_shown() {
    run_page("docs/security.md");
}

/// Few blocks are shown without running, each for a reason the page gives.
#[test]
fn json_blocks_parse_and_configs_are_accepted() {
    for page in PAGES {
        for block in blocks(&read(page)) {
            if block.language() != "json" {
                continue;
            }
            let at = format!("{page}:{}", block.line);
            let value: serde_json::Value = serde_json::from_str(&block.text)
                .unwrap_or_else(|error| panic!("{at}: not JSON: {error}\n{}", block.text));
            if block.has("config") || block.file_name() == Some("gateway.json") {
                // Every section, prices and the webhook entry included, is
                // checked as the config is read.
                GatewayConfig::from_json(&block.text)
                    .unwrap_or_else(|error| panic!("{at}: the proxy refuses it: {error}"));
            }
            let _ = value;
        }
    }
}

/// A `toml` block is a dependency line: the features it names are the crate's.
#[test]
fn every_feature_a_toml_block_names_exists() {
    let manifest = read("Cargo.toml");
    let features = &manifest[manifest.find("[features]").expect("a [features] table")..];
    let declared = |feature: &str| {
        features
            .lines()
            .any(|line| line.starts_with(&format!("{feature} = ")))
    };
    let mut checked = 0;
    for page in PAGES {
        for block in blocks(&read(page)) {
            if block.language() != "toml" {
                continue;
            }
            for line in block
                .text
                .lines()
                .filter(|line| line.starts_with("modelgate"))
            {
                let named = line
                    .split_once("features = [")
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map_or("", |(list, _)| list);
                for feature in named.split(',').map(|name| name.trim().trim_matches('"')) {
                    assert!(
                        feature.is_empty() || declared(feature),
                        "{page}:{}: the feature {feature:?} is not in Cargo.toml",
                        block.line
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0, "no toml block names a feature");
}

#[test]
fn every_block_has_a_known_kind() {
    for page in PAGES {
        for block in blocks(&read(page)) {
            let known = matches!(
                block.language(),
                "sh" | "text" | "json" | "python" | "rust" | "toml"
            );
            assert!(
                known,
                "{page}:{}: a ```{} block: the docs test does not know what to do with it",
                block.line, block.info
            );
        }
    }
}

/// The string literals that follow `marker` (after optional `skip`
/// arguments such as `route,` or `StatusCode::X,`) in `source`.
fn literals_after(source: &str, marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find(marker) {
        rest = &rest[at + marker.len()..];
        let mut text = rest.trim_start();
        // Skip arguments that are not string literals: `route,`, `StatusCode::X,`.
        for _ in 0..2 {
            if text.starts_with('"') {
                break;
            }
            match text.find(',') {
                Some(comma) if !text[..comma].contains('(') && !text[..comma].contains('"') => {
                    text = text[comma + 1..].trim_start();
                }
                _ => break,
            }
        }
        if let Some(literal) = text.strip_prefix('"')
            && let Some(end) = literal.find('"')
        {
            let word = &literal[..end];
            if !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                found.push(word.to_owned());
            }
        }
    }
    found
}

/// The literals of the `=> "word"` arms between `start` and the end of
/// its block.
fn arms_after(source: &str, start: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find(start) {
        rest = &rest[at + start.len()..];
        let end = [rest.find("};"), rest.find("\n    }")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(rest.len());
        found.extend(literals_after(&rest[..end], "=> "));
    }
    found
}

/// Every `.rs` file under `dir`, without its `#[cfg(test)]` module.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            found.push((path, text));
        }
    }
    found
}

/// Names `page` must mention as `` `name` `` (or at the end of a dotted
/// path, `` `section.name` ``); the missing ones.
fn missing_from(page: &str, names: &BTreeSet<String>) -> Vec<String> {
    let text = read(page);
    names
        .iter()
        .filter(|name| !text.contains(&format!("`{name}`")) && !text.contains(&format!(".{name}`")))
        .cloned()
        .collect()
}

#[test]
fn the_error_catalogue_names_every_error_the_source_makes() {
    let source = sources(&root().join("src"));
    let mut names = BTreeSet::new();
    for kind in ErrorKind::ALL {
        names.insert(kind.type_str().to_owned());
        names.insert(kind.status().as_u16().to_string());
    }
    let mut reasons = BTreeSet::new();
    let mut metadata = BTreeSet::new();
    let mut webhook_codes = BTreeSet::new();
    for (path, text) in &source {
        reasons.extend(literals_after(text, "with_metadata(\"reason\","));
        reasons.extend(literals_after(text, "unauthenticated("));
        reasons.extend(literals_after(text, "refusal("));
        reasons.extend(arms_after(text, "let reason = match"));
        reasons.extend(arms_after(text, "fn reason(self)"));
        metadata.extend(literals_after(text, "with_metadata("));
        if path.file_name().is_some_and(|name| name == "error.rs") {
            names.extend(arms_after(text, "pub fn as_str(self)"));
        }
        if path.components().any(|part| part.as_os_str() == "webhook") {
            webhook_codes.extend(literals_after(text, "refused("));
            webhook_codes.extend(literals_after(text, "too_many("));
        }
    }
    // Sanity: the scan finds what is known to be there.
    for known in [
        "unknown_key",
        "leaked_key",
        "code_used",
        "bad_signature",
        "auth_failures",
    ] {
        assert!(
            reasons.contains(known),
            "the scan missed reason {known}: {reasons:?}"
        );
    }
    assert!(
        names.contains("free_per_day"),
        "the scan missed the limit sources"
    );
    assert!(
        webhook_codes.contains("revision_conflict"),
        "{webhook_codes:?}"
    );
    names.extend(reasons);
    names.extend(metadata);
    names.extend(webhook_codes);
    let missing = missing_from("docs/errors.md", &names);
    assert!(
        missing.is_empty(),
        "docs/errors.md does not name (as `name`) these errors, reasons or metadata the source uses: {missing:?}"
    );
}

/// The `pub name:` fields of `struct` in `source`.
fn struct_fields(source: &str, declaration: &str) -> Vec<String> {
    let start = source
        .find(declaration)
        .unwrap_or_else(|| panic!("{declaration} not found"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("pub "))
        .filter_map(|field| {
            field
                .split_once(':')
                .map(|(name, _)| name.trim().to_owned())
        })
        .collect()
}

#[test]
fn the_configuration_page_names_every_section_and_flag() {
    // The sections' files, one after another (not the unit tests, which
    // name the declarations too).
    let mut config = String::new();
    for entry in std::fs::read_dir(root().join("src/proxy/config")).unwrap() {
        let path = entry.unwrap().path();
        if !path.ends_with("tests.rs") {
            config += &std::fs::read_to_string(path).unwrap();
        }
    }
    let mut names: BTreeSet<String> = BTreeSet::new();
    for declaration in [
        "pub struct GatewayConfig {",
        "pub struct UpstreamSection {",
        "pub struct BodySection {",
        "pub struct RetrySection {",
        "pub struct CreditSection {",
        "pub struct ProviderSection {",
        "pub struct GenerationsSection {",
        "pub struct OAuthSection {",
        "pub struct LeakScanningSection {",
        "pub struct NotifyWebhookSection {",
        "pub struct EmailSection {",
        "pub struct AlertsSection {",
        "pub struct PluginsSection {",
        "pub struct PluginEntries {",
    ] {
        names.extend(struct_fields(&config, declaration));
    }
    // The price table's fields are private, read by serde all the same.
    let pricing = std::fs::read_to_string(root().join("src/credit/pricing.rs")).unwrap();
    for declaration in ["struct ConfiguredPrice {", "struct ConfiguredTable {"] {
        let start = pricing.find(declaration).unwrap();
        let body = &pricing[start..];
        let body = &body[declaration.len()..body.find("\n}").unwrap()];
        names.extend(
            body.lines()
                .map(str::trim)
                .filter(|line| !line.starts_with("//") && !line.starts_with('#'))
                .filter_map(|line| line.split_once(':').map(|(name, _)| name.to_owned())),
        );
    }
    assert!(names.contains("max_tokens_per_image") && names.contains("free_models"));
    let quota = std::fs::read_to_string(root().join("src/free_quota/rules.rs")).unwrap();
    names.extend(struct_fields(&quota, "pub struct FreeQuotaRules {"));
    let failures = std::fs::read_to_string(root().join("src/auth/failures.rs")).unwrap();
    names.extend(struct_fields(&failures, "pub struct AuthFailureLimit {"));
    assert!(names.contains("max_in_flight") && names.contains("requests_per_minute"));
    // The webhook entry's route fields and limits, and the secrets
    // providers' fields, are read by hand, not by serde: take the names
    // they read.
    let webhook = std::fs::read_to_string(root().join("src/webhook/config.rs")).unwrap();
    let mut webhook_names = quoted_after(&webhook, &["take(\"", ", route, \""]);
    // What an error calls the route object itself, not a field.
    webhook_names.remove("route");
    assert!(
        webhook_names.contains("inFlightLeaseSeconds") && webhook_names.contains("sessionKey"),
        "{webhook_names:?}"
    );
    names.extend(webhook_names);
    let providers = std::fs::read_to_string(root().join("src/secrets/providers.rs")).unwrap();
    let provider_names = quoted_after(&providers, &["remove(\""]);
    assert!(provider_names.contains("timeoutMs"), "{provider_names:?}");
    names.extend(provider_names);

    // Every flag `proxy --help` lists, but its own `--help`.
    let help = Command::new(examples::binary("proxy"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: Vec<String> = help
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("--"))
        .filter_map(|rest| rest.split([' ', '=']).next())
        .filter(|flag| *flag != "help")
        .map(|flag| format!("--{flag}"))
        .collect();
    assert!(flags.contains(&"--listen".to_owned()), "{flags:?}");
    assert!(flags.contains(&"--bare".to_owned()), "{flags:?}");
    names.extend(flags);
    names.extend(["MODELGATE_ADMIN_KEY", "RUST_LOG"].map(str::to_owned));
    let missing = missing_from("docs/configuration.md", &names);
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name (as `name`) these config fields or flags: {missing:?}"
    );
}

/// The names that follow any of `openers` up to the next `"` in `source`,
/// but dotted paths (a field's parts, named one by one).
fn quoted_after(source: &str, openers: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for opener in openers {
        for (at, _) in source.match_indices(opener) {
            let rest = &source[at + opener.len()..];
            if let Some((name, _)) = rest.split_once('"')
                && !name.is_empty()
                && !name.contains('.')
            {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn the_routes_page_names_every_route() {
    // Every path of the JSON API, as `src/routing.rs` names them once
    // (`NAME = "…";`) for the route table, `{name}` as `{}`.
    let table = std::fs::read_to_string(root().join("src/routing.rs")).unwrap();
    let mut routes = BTreeSet::new();
    for line in table.lines() {
        let Some((_, path)) = line.trim().split_once(" = \"/") else {
            continue;
        };
        let path = format!("/{path}");
        let Some((path, _)) = path.split_once('"') else {
            continue;
        };
        let path: Vec<&str> = path
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "{}"
                } else {
                    segment
                }
            })
            .collect();
        routes.insert(path.join("/"));
    }
    assert!(routes.contains("/api/v1/keys/{}/leaked"), "{routes:?}");
    routes.extend(
        [
            "/api/v1/chat/completions",
            "/api/v1/models",
            "/api/v1/auth/keys",
            "/api/v1/leaks",
            "/settings",
            "/auth",
            "/metrics",
            "/healthz",
            "/readyz",
        ]
        .map(str::to_owned),
    );
    // `{id}`, `{hash}`, … all stand for one segment.
    let mut text = String::new();
    let page = read("docs/routes.md");
    let mut rest = page.as_str();
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        match rest[open..].find('}') {
            Some(close) if !rest[open + 1..open + close].contains([' ', '"', '\n']) => {
                text.push_str("{}");
                rest = &rest[open + close + 1..];
            }
            _ => {
                text.push('{');
                rest = &rest[open + 1..];
            }
        }
    }
    text.push_str(rest);
    let missing: Vec<&String> = routes
        .iter()
        .filter(|route| {
            !text.contains(&format!("{route}`")) && !text.contains(&format!("{route}?"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/routes.md does not document these routes: {missing:?}"
    );
}

#[test]
fn links_between_pages_resolve() {
    for page in PAGES {
        let text = read(page);
        let base = root().join(page).parent().unwrap().to_owned();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap();
            let target = &rest[..end];
            rest = &rest[end..];
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            assert!(
                base.join(file).exists(),
                "{page}: the link {target} points at nothing"
            );
            if let Some(anchor) = target.split_once('#').map(|(_, anchor)| anchor) {
                let linked = std::fs::read_to_string(base.join(file)).unwrap();
                let anchors: Vec<String> = linked
                    .lines()
                    .filter_map(|line| line.strip_prefix('#'))
                    .map(|heading| slug(heading.trim_start_matches('#')))
                    .collect();
                assert!(
                    anchors.iter().any(|slug| slug == anchor),
                    "{page}: the link {target} names no heading of {file}"
                );
            }
        }
    }
}

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn output_patterns_match_as_documented() {
    assert!(output_matches("a…c\n", "abbbc\n"));
    assert!(output_matches("x\n…\nz\n", "x\n1\n2\nz\n"));
    assert!(output_matches("x\n…\nz\n", "x\nz\n"));
    assert!(!output_matches("a…c\n", "abd\n"));
    assert!(!output_matches("x\n", "x\ny\n"));
    assert!(output_matches("{\"a\":…,\"b\":2}\n", "{\"a\":1,\"b\":2}\n"));
}

/// The blocks shown but not run stay few: the set-up commands, the
/// variables a reader sets by hand, and what needs a real upstream, a
/// collector or hours. A new one must be counted here on purpose.
#[test]
fn untested_blocks_stay_few() {
    let untested: Vec<String> = PAGES
        .iter()
        .flat_map(|page| {
            blocks(&read(page))
                .into_iter()
                .filter(|block| block.has("untested"))
                .map(move |block| format!("{page}:{}", block.line))
        })
        .collect();
    // The 14th: Claude Code against the proxy (README), which
    // `clients::claude_code_*` run instead; the 15th Codex (README),
    // which `clients::codex_*` run.
    assert!(
        untested.len() <= 15,
        "{} blocks are marked untested (at most 15): {untested:?}",
        untested.len()
    );
}
