//! Go's `text/template` language in Rust, with Helm's `default`, `indent`, `nindent`, `toYaml` and
//! `toJson`: the engine Platform Mesh renders its profile, its `gotemplates/` and `spec.values`
//! strings with. Data is a [`serde_json::Value`]; the output is a string.
//!
//! ```
//! use gotemplate::{render, Options, Template};
//! use serde_json::json;
//!
//! let data = json!({"name": "mesh", "ports": [80, 443]});
//! let text = "{{ .name }}:{{ range .ports }} {{ . }}{{ end }} {{ .tls | default \"off\" }}";
//! assert_eq!(render("t", text, &data, &Options::default())?, "mesh: 80 443 off");
//!
//! // Parse once, run many times; errors name the template, line and column.
//! let template = Template::parse("ports.yaml", "port: {{ .port }}")?;
//! let err = template.execute(&json!({}), &Options::default()).unwrap_err();
//! assert!(err.to_string().starts_with("template: ports.yaml:1:10:"));
//! # Ok::<(), gotemplate::Error>(())
//! ```
//!
//! The language is Go's: actions, pipelines, variables (`$x :=`, `$x =`, `$`), `if`/`else if`,
//! `range` over lists, maps (sorted keys) and integers with `$i, $v :=`, `break`/`continue`,
//! `with`/`else with`, `define`/`template`/`block`, comments and `{{-`/`-}}` trimming. Functions:
//! Go's builtins, plus `default`, `indent`, `nindent`, `toYaml` and `toJson` with Helm's meaning.
//! Every case of `../shared/reference/gotemplate-conformance` (Go's own output) passes in Go mode
//! ([`Options::go`]); see `tests/conformance.rs`.
//!
//! Where this engine deliberately differs from Go, in the project's mode ([`Options::default`]):
//! - **A missing key is an error** when it would be printed or passed to a function other than
//!   `default`: the message names the template, line, column and key, instead of `<no value>` in a
//!   manifest. `if`, `with`, `range`, `and`, `or`, `not` and `default` take missing keys as empty, so
//!   `{{ .x | default "y" }}` and `{{ if .x }}` work as in Go. A printed `null` is an error too.
//! - **Integers of the data stay integers**: Go code that decodes YAML into `interface{}` sees every
//!   number as a float64, so `replicas: 1000000` would print `1e+06` and `eq .replicas 1` would be a
//!   type error; here the first prints `1000000` and the second compares.
//! - `and`, `or` and `not` are Go's builtins (variadic, short-circuit, returning the deciding value),
//!   not the upstream operator's two-argument replacements; in `if` they decide alike.
//! - `nindent`/`indent` are Helm's (prefix every line, including an empty last one), and `toYaml`
//!   drops the trailing newline as Helm's does, where the upstream operator's `nindent` trims blank
//!   lines and adds a newline.

mod exec;
mod funcs;
mod parse;
mod value;

pub use value::Numbers;

/// What happens with a key that is not in its map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// The project's rule: usable where emptiness is asked for, an error where printed or passed on.
    Strict,
    /// Go's default (`missingkey=default`/`zero` for generic maps): prints `<no value>`.
    Print,
    /// Go's `missingkey=error`: any lookup of a missing key is an error.
    Error,
}

/// Execution options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How keys absent from their map are treated.
    pub missing_key: MissingKey,
    /// Whether data integers stay integers.
    pub numbers: Numbers,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            missing_key: MissingKey::Strict,
            numbers: Numbers::Exact,
        }
    }
}

impl Options {
    /// Exactly Go's behaviour (for the conformance suite and comparisons with upstream output).
    pub fn go() -> Self {
        Options {
            missing_key: MissingKey::Print,
            numbers: Numbers::GoFloat,
        }
    }
}

/// A parse or execution error. Its text is worded as Go words it:
/// `template: NAME:LINE: MESSAGE` for a parse error and
/// `template: NAME:LINE:COL: executing "NAME" at <SRC>: MESSAGE` for an execution error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The text is not a valid template.
    #[error("template: {template}{}: {message}", line_part(.line))]
    Parse {
        /// The template's name.
        template: String,
        /// The line the error is on, when it is on one.
        line: Option<usize>,
        /// What is wrong, in Go's words.
        message: String,
    },
    /// Running the template failed.
    #[error("template: {template}:{line}:{col}: executing {template:?}{}: {message}", at_part(.at))]
    Exec {
        /// The template's name.
        template: String,
        /// The line of the failing action.
        line: usize,
        /// The column of the failing action.
        col: usize,
        /// The source of the failing action (`.config.port`), when there is one.
        at: Option<String>,
        /// What went wrong, in Go's words.
        message: String,
    },
}

fn line_part(line: &Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn at_part(at: &Option<String>) -> String {
    at.as_ref()
        .map(|a| format!(" at <{a}>"))
        .unwrap_or_default()
}

impl Error {
    fn parse(name: &str, line: usize, message: &str) -> Error {
        Error::Parse {
            template: name.to_string(),
            line: (line != 0).then_some(line),
            message: message.to_string(),
        }
    }

    fn exec(name: &str, pos: parse::Pos, src: &str, message: impl Into<String>) -> Error {
        Error::Exec {
            template: name.to_string(),
            line: pos.line,
            col: pos.col,
            at: (!src.is_empty()).then(|| src.to_string()),
            message: message.into(),
        }
    }
}

/// A parsed template, ready to run any number of times.
#[derive(Clone, Debug)]
pub struct Template {
    name: String,
    tree: parse::Tree,
}

impl Template {
    /// Parses `text`; `name` appears in every error.
    pub fn parse(name: &str, text: &str) -> Result<Template, Error> {
        Ok(Template {
            name: name.to_string(),
            tree: parse::parse(name, text, &funcs::exists)?,
        })
    }

    /// Runs the template with `data`.
    pub fn execute(&self, data: &serde_json::Value, options: &Options) -> Result<String, Error> {
        let root = value::V::from_json(data, options.numbers);
        let mut exec = exec::Exec::new(&self.name, &self.tree, options, root);
        exec.run()?;
        Ok(exec.out)
    }
}

/// Parses and runs in one step.
pub fn render(
    name: &str,
    text: &str,
    data: &serde_json::Value,
    options: &Options,
) -> Result<String, Error> {
    Template::parse(name, text)?.execute(data, options)
}

/// Templates rendered with fixed [`Options`]; `Engine::default()` is the project's mode, the one
/// the PlatformMesh controller renders with.
#[derive(Clone, Copy, Debug, Default)]
pub struct Engine {
    /// How templates run.
    pub options: Options,
}

impl Engine {
    /// Parses and runs `text` (named `name` in errors) with `data` and the engine's options.
    pub fn render(
        &self,
        name: &str,
        text: &str,
        data: &serde_json::Value,
    ) -> Result<String, Error> {
        render(name, text, data, &self.options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strict(text: &str, data: serde_json::Value) -> Result<String, String> {
        render("t", text, &data, &Options::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_printed_missing_key_is_an_error_naming_template_line_and_key() {
        let err =
            strict("a: 1\nb: {{ .config.port }}\n", json!({"config": {}})).expect_err("missing");
        assert_eq!(
            err,
            "template: t:2:7: executing \"t\" at <.config.port>: map has no entry for key \".config.port\"; printing it would write \"<no value>\" (use default, if or with)"
        );
        let err = strict("{{ toYaml $.values.x }}", json!({"values": {}})).expect_err("missing");
        assert!(err.contains("\"$.values.x\""), "{err}");
        let err = strict("{{ .n }}", json!({"n": null})).expect_err("null");
        assert!(err.contains("the value is null"), "{err}");
    }

    #[test]
    fn errors_read_as_gos() {
        assert_eq!(
            strict("a\n{{ if 1 }}", json!({})).expect_err("eof"),
            "template: t:2: unexpected EOF"
        );
        let err = Template::parse("t", "{{ end }}").expect_err("end");
        assert_eq!(err.to_string(), "template: t: unexpected {{end}}");
        assert!(matches!(err, Error::Parse { line: None, .. }), "{err:?}");
        let err =
            render("t", "{{ .a.b }}", &json!({"a": {}}), &Options::default()).expect_err("missing");
        let Error::Exec { line, col, at, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((*line, *col, at.as_deref()), (1, 4, Some(".a.b")));
        let big = strict(
            &format!("{{{{ range 1000000 }}}}{}{{{{ end }}}}", "x".repeat(80)),
            json!({}),
        )
        .expect_err("output");
        assert!(big.starts_with("template: t:"), "{big}");
        assert!(big.contains(": executing \"t\": output exceeds"), "{big}");
    }

    #[test]
    fn missing_keys_are_empty_where_emptiness_is_asked() {
        let data = json!({"config": {"name": "x"}});
        for (text, want) in [
            ("{{ .config.port | default 8443 }}", "8443"),
            ("{{ if .config.port }}a{{ else }}b{{ end }}", "b"),
            ("{{ with .config.port }}a{{ else }}b{{ end }}", "b"),
            ("{{ range .config.ports }}a{{ else }}b{{ end }}", "b"),
            (
                "{{ if and .config.name (not .config.port) }}y{{ end }}",
                "y",
            ),
            ("{{ ((.config.ocm).component).name | default \"c\" }}", "c"),
        ] {
            assert_eq!(strict(text, data.clone()).as_deref(), Ok(want), "{text}");
        }
    }

    #[test]
    fn integers_stay_integers_in_the_projects_mode() {
        let data = json!({"replicas": 1000000, "port": 443});
        assert_eq!(
            strict(
                "{{ .replicas }} {{ if eq .port 443 }}tls{{ end }}",
                data.clone()
            )
            .as_deref(),
            Ok("1000000 tls")
        );
        let go = render("t", "{{ .replicas }}", &data, &Options::go()).expect("go");
        assert_eq!(go, "1e+06");
    }

    #[test]
    fn runaway_templates_are_stopped() {
        let err = strict(
            "{{ define \"r\" }}{{ template \"r\" . }}{{ end }}{{ template \"r\" . }}",
            json!({}),
        )
        .expect_err("recursion");
        assert!(err.contains("maximum template depth"), "{err}");
        let err = strict("{{ range 100000000 }}x{{ end }}", json!({})).expect_err("range");
        assert!(err.contains("exceeds"), "{err}");
        // Input from users (spec.values strings) cannot exhaust the stack.
        let deep = format!("{{{{ {}1{} }}}}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(strict(&deep, json!({}))
            .expect_err("parens")
            .contains("nested too deeply"));
        let deep = format!(
            "{}{}",
            "{{ if 1 }}".repeat(100_000),
            "{{ end }}".repeat(100_000)
        );
        assert!(strict(&deep, json!({}))
            .expect_err("ifs")
            .contains("nested too deeply"));
    }
}
