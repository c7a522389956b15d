//! The dependency rules ARCHITECTURE.md states, held against the code.
//!
//! ARCHITECTURE.md's section "Dependency rules" has one ```` ```text ````
//! block of lines `module: dep, dep, ...`: which top-level modules of
//! `src/` each top-level module may use (`*`: every other one). This test
//!
//! - checks that the block names every module `src/lib.rs` declares, and
//!   nothing else;
//! - checks that the allowed graph has no cycle;
//! - reads each module's `.rs` files (`src/<m>.rs`, `src/<m>/**`) for
//!   `crate::<module>` paths (`use crate::{a, b::C}` groups included) on
//!   lines that are not comments, up to a `#[cfg(test)] mod … {` (the unit
//!   tests at the end of a file may use anything), and fails naming each
//!   edge the rules do not allow, with where it occurs;
//! - fails naming each edge the rules allow that no such path uses, so the
//!   block says what the code does, not what it once did.
//!
//! Paths through `super::` never leave a top-level module unless they climb
//! out of it, which the code does not do; they are not read.
//!
//! It also holds two more of ARCHITECTURE.md's rules: a `mod.rs` holds its
//! module's docs and its `mod` and `use` lines only; and layers never read
//! the system time, so no line of `src/` outside `src/clock.rs` reads the
//! wall clock (`Utc::now`, `SystemTime::now`, …; monotonic `Instant::now`
//! is fine), doc examples and unit tests included.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level modules `src/lib.rs` declares (`mod x;`, `pub mod x;`,
/// whatever attributes stand before them).
fn declared_modules() -> BTreeSet<String> {
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("read src/lib.rs");
    let mut modules = BTreeSet::new();
    for line in lib.lines() {
        let mut line = line.trim();
        if line.starts_with("//") {
            continue;
        }
        while line.starts_with("#[") {
            // An attribute on the same line as the item: `#[cfg(x)] mod y;`.
            match line.find("] ") {
                Some(end) => line = line[end + 2..].trim_start(),
                None => break,
            }
        }
        if let Some(rest) = line.strip_prefix("pub") {
            line = rest.trim_start();
            if line.starts_with('(') {
                match line.find(')') {
                    Some(end) => line = line[end + 1..].trim_start(),
                    None => continue,
                }
            }
        }
        if let Some(name) = line
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            modules.insert(name.trim().to_string());
        }
    }
    modules
}

/// The rules: module → what it may use (`None`: `*`, every module).
type Rules = BTreeMap<String, Option<BTreeSet<String>>>;

/// The ```` ```text ```` block under ARCHITECTURE.md's `## Dependency
/// rules` heading.
fn rules_block(architecture: &str) -> Vec<(usize, String)> {
    let mut in_section = false;
    let mut in_block = false;
    let mut lines = Vec::new();
    for (index, line) in architecture.lines().enumerate() {
        if !in_block && line.starts_with("## ") {
            in_section = line.trim() == "## Dependency rules";
            continue;
        }
        if in_section && !in_block && line.trim() == "```text" {
            in_block = true;
            continue;
        }
        if in_block {
            if line.trim() == "```" {
                return lines;
            }
            lines.push((index + 1, line.to_string()));
        }
    }
    panic!("ARCHITECTURE.md has no ```text block under `## Dependency rules`");
}

fn parse_rules(architecture: &str) -> Result<Rules, Vec<String>> {
    let mut rules = Rules::new();
    let mut errors = Vec::new();
    for (line_number, line) in rules_block(architecture) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((module, deps)) = line.split_once(':') else {
            errors.push(format!(
                "ARCHITECTURE.md:{line_number}: `{line}` is not `module: dep, dep`"
            ));
            continue;
        };
        let module = module.trim().to_string();
        let deps = deps.trim();
        let allowed = if deps == "*" {
            None
        } else {
            Some(
                deps.split(',')
                    .map(str::trim)
                    .filter(|dep| !dep.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        };
        if rules.insert(module.clone(), allowed).is_some() {
            errors.push(format!(
                "ARCHITECTURE.md:{line_number}: `{module}` has two lines"
            ));
        }
    }
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(errors)
    }
}

fn rules() -> Rules {
    let architecture =
        fs::read_to_string(root().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    parse_rules(&architecture).unwrap_or_else(|errors| panic!("{}", errors.join("\n")))
}

fn allows(rules: &Rules, from: &str, to: &str) -> bool {
    match rules.get(from) {
        Some(None) => from != to,
        Some(Some(allowed)) => allowed.contains(to),
        None => false,
    }
}

/// The source the rules apply to: comment lines dropped (a trailing
/// ` // …` cut off), and nothing from a `#[cfg(test)]` on a `mod … {` on.
/// Line numbers are kept for the messages.
fn production_code(source: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut code = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]" && starts_inline_module(&lines[index + 1..]) {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let line = match line.find(" // ") {
            Some(comment) => &line[..comment],
            None => line,
        };
        code.push((index + 1, line));
    }
    code
}

/// Whether the next item (past blank lines and attributes) is `mod name {`.
fn starts_inline_module(rest: &[&str]) -> bool {
    let Some(item) = rest
        .iter()
        .map(|line| line.trim())
        .find(|line| !line.is_empty() && !line.starts_with("#[") && !line.starts_with("//"))
    else {
        return false;
    };
    let item = match item.strip_prefix("pub") {
        Some(rest) if rest.starts_with('(') => rest.find(')').map_or(rest, |end| &rest[end + 1..]),
        Some(rest) => rest,
        None => item,
    };
    item.trim_start().starts_with("mod ") && item.trim_end().ends_with('{')
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn leading_ident(text: &str) -> &str {
    let text = text.trim_start();
    let end = text.find(|c: char| !is_ident_char(c)).unwrap_or(text.len());
    &text[..end]
}

/// Every top-level name a `crate::` path of the code reaches, with the
/// line it is on: `crate::a::B` gives `a`; `crate::{a::B, c}` gives `a`
/// and `c`.
fn crate_paths(code: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut text = String::new();
    let mut line_starts = Vec::new();
    for (number, line) in code {
        line_starts.push((text.len(), *number));
        text.push_str(line);
        text.push('\n');
    }
    let line_at = |offset: usize| {
        let index = line_starts.partition_point(|(start, _)| *start <= offset);
        line_starts[index - 1].1
    };
    let mut found = Vec::new();
    for (offset, _) in text.match_indices("crate::") {
        let before = text[..offset].chars().next_back();
        if before.is_some_and(|c| is_ident_char(c) || c == ':') {
            continue;
        }
        let rest = &text[offset + "crate::".len()..];
        let line = line_at(offset);
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut part_start = 0;
            for (index, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.push((line, leading_ident(&group[part_start..index]).to_string()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push((line, leading_ident(&group[part_start..index]).to_string()));
                        part_start = index + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.push((line, leading_ident(rest).to_string()));
        }
    }
    found.retain(|(_, name)| !name.is_empty());
    found
}

fn rust_files(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .expect("read a source directory")
            .map(|entry| entry.expect("read a directory entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            rust_files(&entry, files);
        }
    } else if path.is_file() && path.extension().is_some_and(|extension| extension == "rs") {
        files.push(path.to_path_buf());
    }
}

/// Each edge between top-level modules the code makes, with where.
fn real_edges(modules: &BTreeSet<String>) -> BTreeMap<(String, String), Vec<String>> {
    let src = root().join("src");
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for module in modules {
        let mut files = Vec::new();
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        rust_files(&src.join(module), &mut files);
        for file in files {
            let source = fs::read_to_string(&file).expect("read a source file");
            let shown = file
                .strip_prefix(root())
                .unwrap_or(&file)
                .display()
                .to_string();
            for (line, target) in crate_paths(&production_code(&source)) {
                if &target != module && modules.contains(&target) {
                    edges
                        .entry((module.clone(), target))
                        .or_default()
                        .push(format!("{shown}:{line}"));
                }
            }
        }
    }
    edges
}

#[test]
fn the_rules_name_every_module_and_only_modules() {
    let modules = declared_modules();
    assert!(
        modules.contains("proxy") && modules.contains("store"),
        "src/lib.rs read wrong: {modules:?}"
    );
    let rules = rules();
    let mut errors = Vec::new();
    for module in &modules {
        if !rules.contains_key(module) {
            errors.push(format!(
                "src/{module} has no line in ARCHITECTURE.md's dependency rules"
            ));
        }
    }
    for (module, allowed) in &rules {
        if !modules.contains(module) {
            errors.push(format!(
                "the dependency rules name `{module}`, which src/lib.rs does not declare"
            ));
        }
        for dep in allowed.iter().flatten() {
            if !modules.contains(dep) {
                errors.push(format!(
                    "`{module}` may use `{dep}`, which src/lib.rs does not declare"
                ));
            }
            if dep == module {
                errors.push(format!("`{module}` lists itself"));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn the_allowed_graph_has_no_cycle() {
    let rules = rules();
    let modules: Vec<&String> = rules.keys().collect();
    let uses = |module: &str| -> Vec<String> {
        modules
            .iter()
            .filter(|other| allows(&rules, module, other))
            .map(|other| other.to_string())
            .collect()
    };
    // Depth first; a module met again while on the path closes a cycle.
    fn visit(
        module: &str,
        uses: &dyn Fn(&str) -> Vec<String>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|on_path| on_path == module) {
            let mut cycle = path[start..].to_vec();
            cycle.push(module.to_string());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in uses(module) {
            if let Some(cycle) = visit(&next, uses, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for module in &modules {
        if let Some(cycle) = visit(module, &uses, &mut Vec::new(), &mut done) {
            panic!("the dependency rules allow a cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn imports_follow_the_rules() {
    let modules = declared_modules();
    let rules = rules();
    let mut errors = Vec::new();
    for ((from, to), places) in real_edges(&modules) {
        if !allows(&rules, &from, &to) {
            errors.push(format!(
                "{from} uses {to}, which ARCHITECTURE.md's dependency rules do not allow: {}",
                places.join(", ")
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn every_allowed_edge_is_used() {
    let modules = declared_modules();
    let used = real_edges(&modules);
    let mut errors = Vec::new();
    for (from, allowed) in rules() {
        for to in allowed.iter().flatten() {
            if !used.contains_key(&(from.clone(), to.clone())) {
                errors.push(format!(
                    "ARCHITECTURE.md's dependency rules let {from} use {to}, which no \
                     `crate::{to}` path in src/{from} does: take it off {from}'s line"
                ));
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// What reads the wall clock; a layer asks its `Clock` instead.
const WALL_CLOCK_READS: [&str; 4] = [
    "Utc::now",
    "SystemTime::now",
    "Local::now",
    "OffsetDateTime::now",
];

/// The one file that reads the wall clock: `SystemClock`.
const THE_CLOCK: &str = "src/clock.rs";

/// Each line of `source` that reads the wall clock: its number and text.
fn wall_clock_reads(source: &str) -> Vec<(usize, String)> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            WALL_CLOCK_READS.iter().any(|read| {
                line.match_indices(read).any(|(at, _)| {
                    // `MyUtc::now` is not `Utc::now`.
                    !line[..at].chars().next_back().is_some_and(is_ident_char)
                })
            })
        })
        .map(|(index, line)| (index + 1, line.trim().to_string()))
        .collect()
}

#[test]
fn only_the_clock_reads_the_wall_clock() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut errors = Vec::new();
    for file in files {
        let shown = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        if shown == THE_CLOCK {
            continue;
        }
        let source = fs::read_to_string(&file).expect("read a source file");
        for (line, text) in wall_clock_reads(&source) {
            errors.push(format!(
                "{shown}:{line} reads the wall clock (`{text}`): take the instant from the \
                 `Clock` given (`crate::clock`) or a `now` argument; tests use a fixed \
                 instant or a `ManualClock`"
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn wall_clock_reads_are_found_wherever_they_are() {
    let source = r#"use chrono::Utc;
/// let now = Utc::now();
fn f() -> u64 { std::time::SystemTime::now().elapsed().unwrap().as_secs() }
let local = chrono::Local::now();
let fine = clock.now();
let fine_too = std::time::Instant::now();
let not_chrono = MyUtc::now();
"#;
    let lines: Vec<usize> = wall_clock_reads(source)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(lines, [2, 3, 4]);
}

/// The items of a `mod.rs` that are neither `mod` nor `use` lines (nor
/// docs, comments or attributes), with the line each starts on: a `mod.rs`
/// holds its module's docs and says what the module is made of, and the
/// rest lives in files named for what they hold.
fn items_besides_mod_and_use(source: &str) -> Vec<(usize, String)> {
    let mut items = Vec::new();
    let mut statement = String::new();
    let mut starts_on = 0;
    let mut depth = 0usize;
    for (index, line) in source.lines().enumerate() {
        let code = match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        };
        let code = code.trim();
        if code.is_empty() || (depth == 0 && code.starts_with("#[")) {
            continue;
        }
        if statement.trim().is_empty() {
            statement.clear();
            starts_on = index + 1;
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            statement.push(c);
            // An item ends at its `;`, or at the `}` closing its block; the
            // braces of a `use` group are followed by its `;`.
            let ends =
                depth == 0 && (c == ';' || (c == '}' && !keyword(&statement).starts_with("use ")));
            if ends {
                let item = statement.trim().to_string();
                statement.clear();
                let words = keyword(&item);
                let declares =
                    (words.starts_with("mod ") || words.starts_with("use ")) && item.ends_with(';');
                if !declares {
                    items.push((starts_on, item.chars().take(60).collect()));
                }
            }
        }
        statement.push(' ');
    }
    if !statement.trim().is_empty() {
        items.push((starts_on, statement.trim().chars().take(60).collect()));
    }
    items
}

/// `item` from its first keyword on: past `pub` or `pub(…)`.
fn keyword(item: &str) -> &str {
    let item = item.trim_start();
    let rest = match item.strip_prefix("pub") {
        Some(rest) => match rest.strip_prefix('(') {
            Some(scoped) => scoped.split_once(')').map_or(rest, |(_, after)| after),
            None => rest,
        },
        None => item,
    };
    rest.trim_start()
}

#[test]
fn mod_rs_files_hold_docs_and_declarations_only() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut errors = Vec::new();
    for file in files
        .iter()
        .filter(|file| file.file_name().is_some_and(|name| name == "mod.rs"))
    {
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        let source = fs::read_to_string(file).expect("read a source file");
        for (line, item) in items_besides_mod_and_use(&source) {
            errors.push(format!(
                "{shown}:{line} holds `{item}`: a mod.rs holds its module's docs and its \
                 mod and use lines; move this into a file named for what it holds"
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn declarations_are_told_from_items() {
    let source = r#"//! Docs.
//! ```
//! fn in_the_docs() {}
//! ```

mod a;
#[cfg(feature = "x")]
pub(crate) mod b;
pub use a::{
    One, // the first
    Two,
};
use std::fmt; // a trailing comment with fn in it
/// A constant.
pub const C: u8 = 1;
#[cfg(test)]
mod tests {
    fn f() {}
}
"#;
    let lines: Vec<usize> = items_besides_mod_and_use(source)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(lines, [15, 17]);
}

/// The reader itself, on a made-up file: what it must find and skip.
#[test]
fn crate_paths_are_read_from_code_only() {
    let source = r#"//! Docs naming [`crate::docs_only`].
use crate::{alpha::A, beta, gamma::{self, G}};
use crate::delta::{D, E};
/// A [`crate::doc_link`].
fn f() -> crate::epsilon::Thing { // crate::trailing_comment
    // crate::comment_only
    pub(crate) fn g() {}
    let x = not_crate::zeta::X;
    crate::eta::call()
}
#[cfg(test)]
fn test_helper() -> crate::theta::T {}
use crate::{
    iota::I,
    kappa,
};

#[cfg(test)]
#[allow(unused)]
mod tests {
    use crate::lambda::L;
}
"#;
    let names: Vec<String> = crate_paths(&production_code(source))
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    assert_eq!(
        names,
        [
            "alpha", "beta", "gamma", "delta", "epsilon", "eta", "theta", "iota", "kappa"
        ]
    );
    let lines: Vec<usize> = crate_paths(&production_code(source))
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(lines, [2, 2, 2, 3, 5, 9, 12, 13, 13]);
}

#[test]
fn rules_parse_and_refuse_what_they_should() {
    let page = "# A\n\n## Dependency rules\n\n```text\na: b, c\nb: c\nc:\nd: *\n```\n";
    let rules = parse_rules(page).unwrap();
    assert!(allows(&rules, "a", "c") && !allows(&rules, "c", "a"));
    assert!(allows(&rules, "d", "a") && !allows(&rules, "d", "d"));
    assert!(parse_rules("## Dependency rules\n```text\na: b\na: c\n```\n").is_err());
    assert!(parse_rules("## Dependency rules\n```text\na b\n```\n").is_err());
}

/// What the layers learn about a request travels in its `RequestContext`
/// only: a member looked up as an extension of its own (through an axum
/// `Extension` too) would compile and find nothing.
#[test]
fn the_contexts_members_are_never_extensions_of_their_own() {
    let mut files = Vec::new();
    for folder in ["src", "tests", "examples", "benches", "docs"] {
        rust_files(&root().join(folder), &mut files);
    }
    files.push(root().join("README.md"));
    for page in fs::read_dir(root().join("docs")).expect("read docs/") {
        let page = page.expect("read a docs entry").path();
        if page.extension().is_some_and(|extension| extension == "md") {
            files.push(page);
        }
    }
    let mut found = Vec::new();
    // This file names them as examples of what is looked for.
    let this_file = root().join("tests/it/architecture.rs");
    for file in files.iter().filter(|file| **file != this_file) {
        let text = fs::read_to_string(file).expect("read a source file");
        for lookup in extension_lookups_of_context_members(&text) {
            found.push(format!("{}: {lookup}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "read these from the RequestContext instead:\n{}",
        found.join("\n")
    );
}

/// The context's members that `text` names as extensions of their own:
/// `get::<Principal>`, `get::<crate::auth::Principal>`, `Extension<…>`,
/// `Option<&Principal> = ….extensions().get()`, whatever the whitespace.
fn extension_lookups_of_context_members(text: &str) -> Vec<String> {
    const MEMBERS: [&str; 5] = [
        "Principal",
        "ChatRequest",
        "ByokCredential",
        "SentUpstream",
        "AdmissionPlan",
    ];
    const BEFORE: [&str; 6] = [
        "get::<",
        "get_mut::<",
        "remove::<",
        "insert::<",
        "Extension<",
        "Option<&",
    ];
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let mut found = Vec::new();
    for member in MEMBERS {
        for (at, _) in squeezed.match_indices(member) {
            let after = &squeezed[at + member.len()..];
            if !after.starts_with('>') {
                continue;
            }
            // A path before the name (`crate::auth::`) is skipped.
            let path_start = squeezed[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |index| index + 1);
            let path = &squeezed[path_start..at];
            if !(path.is_empty() || path.ends_with("::")) {
                continue;
            }
            let before = &squeezed[..path_start];
            let Some(opening) = BEFORE.iter().find(|opening| before.ends_with(*opening)) else {
                continue;
            };
            if *opening == "Option<&" {
                // Only a type given to an extension lookup on its right.
                let statement = after.split(';').next().unwrap_or_default();
                if !statement.contains("extensions()") && !statement.contains("extensions_mut()") {
                    continue;
                }
            }
            found.push(format!("{opening}{path}{member}>"));
        }
    }
    found
}

#[test]
fn lookups_of_context_members_are_found_however_written() {
    let found = extension_lookups_of_context_members(
        r#"
        request.extensions().get::<Principal>();
        request.extensions().get::< crate::auth::ChatRequest >();
        async fn chat(Extension(p): Extension<modelgate::auth::Principal>) {}
        let sent: Option<&SentUpstream> = request
            .extensions()
            .get();
        let fine: Option<&Principal> = context.principal.as_ref();
        context.principal = Some(Principal::for_tests("a"));
        let chat: Vec<ChatRequest> = Vec::new();
        "#,
    );
    assert_eq!(
        found,
        [
            "get::<Principal>",
            "Extension<modelgate::auth::Principal>",
            "get::<crate::auth::ChatRequest>",
            "Option<&SentUpstream>",
        ]
    );
}
