//! A small `--flag value` parser for the examples: clear messages for bad
//! flags, no dependency for a few options and subcommands.

#![allow(dead_code)]

use std::collections::HashMap;

/// Flags given as `--name value`, checked against the allowed names.
pub struct Args {
    values: HashMap<String, String>,
}

impl Args {
    /// Reads the process's arguments; `allowed` are the flag names without
    /// `--`. `--help` prints `usage` and exits 0.
    pub fn parse(allowed: &[&str], usage: &str) -> Result<Args, String> {
        Self::parse_from(std::env::args().skip(1), allowed, usage)
    }

    /// The first argument when it is a word, not a flag (a subcommand such
    /// as `keygen`), and the arguments after it.
    pub fn command() -> (Option<String>, Vec<String>) {
        let mut arguments: Vec<String> = std::env::args().skip(1).collect();
        match arguments.first() {
            Some(first) if !first.starts_with('-') => {
                let command = arguments.remove(0);
                (Some(command), arguments)
            }
            _ => (None, arguments),
        }
    }

    /// [`parse`](Self::parse) over `arguments` (without the program name).
    pub fn parse_from(
        arguments: impl IntoIterator<Item = String>,
        allowed: &[&str],
        usage: &str,
    ) -> Result<Args, String> {
        let mut values = HashMap::new();
        let mut arguments = arguments.into_iter();
        while let Some(argument) = arguments.next() {
            if argument == "--help" || argument == "-h" {
                println!("{usage}");
                std::process::exit(0);
            }
            let Some(name) = argument.strip_prefix("--") else {
                return Err(format!("unexpected argument {argument:?}\n{usage}"));
            };
            let (name, value) = match name.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None => {
                    let value = arguments
                        .next()
                        .ok_or_else(|| format!("--{name} needs a value\n{usage}"))?;
                    (name.to_owned(), value)
                }
            };
            if !allowed.contains(&name.as_str()) {
                return Err(format!("unknown flag --{name}\n{usage}"));
            }
            if values.insert(name.clone(), value).is_some() {
                return Err(format!("--{name} given twice"));
            }
        }
        Ok(Args { values })
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The value of `--name` parsed, or `default`.
    pub fn parsed<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| format!("--{name} {text:?} is not valid")),
        }
    }
}
