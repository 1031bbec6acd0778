//! `x-kubernetes-validations` (CEL) evaluation (reference E6), on the `cel`
//! interpreter with the Kubernetes function libraries from `kube-cel`.
//!
//! * Rules run at every schema node whose value is present and not `null`;
//!   `self` is the node's value converted by [`super::cel_value`].
//! * Transition rules (those referencing `oldSelf`) run only when the old
//!   value of the node exists: object properties and map entries correlate
//!   by key, `x-kubernetes-list-type: map` items by their key fields, and
//!   nothing correlates inside `set`/`atomic` lists. With
//!   `optionalOldSelf: true` they always run and `oldSelf` is an optional.
//! * A failed rule yields `Invalid value: "<schema type>": <message>` at the
//!   node (plus `fieldPath`), where the message is the evaluated
//!   `messageExpression`, else `message`, else `failed rule: <rule>`;
//!   `reason` switches to `Forbidden`, `Required value` or
//!   `Duplicate value`. Field paths render map entries as `[key]`; errors
//!   of root rules have the field `<nil>`, as in kube.
//! * Runtime errors yield `<error> evaluating rule: <rule>`; a rule that does
//!   not compile yields an `Internal error` (kube rejects such schemas when
//!   they are defined).
//!
//! Compiled programs are cached per thread. The interpreter is guarded
//! against panics; there is no cost budget.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;

use kube_cel::cel::{self, objects::OptionalValue, Context, Program};
use kube_cel::KubeCelExt as _;
use serde_json::Value;

use super::cel_value::to_cel;
use super::node::{self, Additional, MAX_DEPTH};
use super::path::Path;
use crate::field_error::{FieldError, FieldErrorKind};

thread_local! {
    static BASE: Context<'static> = {
        let mut ctx = Context::default();
        ctx.register_all();
        ctx
    };
    static PROGRAMS: RefCell<HashMap<String, Result<Rc<Program>, String>>> =
        RefCell::new(HashMap::new());
}

/// Compiles (or fetches from the per-thread cache) a CEL expression.
fn compile(src: &str) -> Result<Rc<Program>, String> {
    PROGRAMS.with(|cache| {
        if let Some(p) = cache.borrow().get(src) {
            return p.clone();
        }
        let compiled = match catch_unwind(AssertUnwindSafe(|| Program::compile(src))) {
            Ok(Ok(p)) => Ok(Rc::new(p)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the CEL parser failed on this expression".to_string()),
        };
        let mut cache = cache.borrow_mut();
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(src.to_string(), compiled.clone());
        compiled
    })
}

/// Runs a program, turning interpreter panics into errors.
fn execute(p: &Program, ctx: &Context<'_>) -> Result<cel::Value, String> {
    match catch_unwind(AssertUnwindSafe(|| p.execute(ctx))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("internal error in the CEL interpreter".to_string()),
    }
}

/// Parses a string with a CEL conversion function (`timestamp`, `duration`).
pub(crate) fn parse_with(func: &str, s: &str) -> Option<cel::Value> {
    let program = compile(&format!("{func}(x)")).ok()?;
    BASE.with(|base| {
        let mut ctx = base.new_inner_scope();
        ctx.add_variable_from_value("x", cel::Value::String(Arc::new(s.to_string())));
        execute(&program, &ctx).ok()
    })
}

/// Evaluates every `x-kubernetes-validations` rule of `schema` against `obj`
/// (an entire object; `old` is the stored object on update, `None` on
/// create) and returns the failures.
pub fn validate_cel(obj: &Value, old: Option<&Value>, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk(obj, old, schema, &Path::root(), true, 0, &mut errs);
    errs
}

fn walk(
    v: &Value,
    old: Option<&Value>,
    s: &Value,
    path: &Path,
    resource: bool,
    depth: usize,
    errs: &mut Vec<FieldError>,
) {
    if depth > MAX_DEPTH || v.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
        if !rules.is_empty() {
            run_rules(rules, v, old, s, path, resource, errs);
        }
    }
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                if resource && k == "metadata" {
                    continue;
                }
                let old_child = old.and_then(|o| o.get(k));
                if let Some(ps) = node::property(s, k) {
                    let p = path.field(k);
                    walk(
                        child,
                        old_child,
                        ps,
                        &p,
                        node::embedded(ps),
                        depth + 1,
                        errs,
                    );
                } else if let Additional::Schema(a) = node::additional(s) {
                    let p = path.key(k);
                    walk(child, old_child, a, &p, node::embedded(a), depth + 1, errs);
                }
            }
        }
        Value::Array(a) => {
            let Some(items) = node::items(s) else { return };
            let keys = node::list_map_keys(s);
            let correlate = node::list_type(s) == Some("map") && !keys.is_empty();
            let old_items = old.and_then(Value::as_array);
            for (i, x) in a.iter().enumerate() {
                let old_x = if correlate {
                    let t = node::map_key_tuple(x, &keys);
                    old_items.and_then(|o| {
                        o.iter()
                            .find(|y| node::tuple_eq(&t, &node::map_key_tuple(y, &keys)))
                    })
                } else {
                    None
                };
                let p = path.index(i);
                walk(x, old_x, items, &p, node::embedded(items), depth + 1, errs);
            }
        }
        _ => {}
    }
}

/// One `x-kubernetes-validations` entry.
struct Rule<'a> {
    rule: &'a str,
    message: Option<&'a str>,
    message_expression: Option<&'a str>,
    reason: Option<&'a str>,
    field_path: Option<&'a str>,
    optional_old_self: bool,
}

impl<'a> Rule<'a> {
    fn parse(v: &'a Value) -> Option<Self> {
        let text = |k: &str| v.get(k).and_then(Value::as_str);
        Some(Rule {
            rule: text("rule")?,
            message: text("message"),
            message_expression: text("messageExpression"),
            reason: text("reason"),
            field_path: text("fieldPath"),
            optional_old_self: node::flag(v, "optionalOldSelf"),
        })
    }
}

fn run_rules(
    rules: &[Value],
    v: &Value,
    old: Option<&Value>,
    s: &Value,
    path: &Path,
    resource: bool,
    errs: &mut Vec<FieldError>,
) {
    let type_name = node::ty(s).unwrap_or("");
    let this = to_cel(v, Some(s), resource);
    let old_this = old.map(|o| to_cel(o, Some(s), resource));
    BASE.with(|base| {
        for raw in rules {
            let Some(rule) = Rule::parse(raw) else {
                continue;
            };
            let program = match compile(rule.rule) {
                Ok(p) => p,
                Err(e) => {
                    let detail = format!("rule compile error: {e}: {}", rule.rule.trim());
                    errs.push(FieldError::internal(field_name(path), detail));
                    continue;
                }
            };
            let transition = program.references().has_variable("oldSelf");
            let mut ctx = base.new_inner_scope();
            ctx.add_variable_from_value("self", this.clone());
            if transition {
                match (&old_this, rule.optional_old_self) {
                    (Some(o), false) => ctx.add_variable_from_value("oldSelf", o.clone()),
                    (Some(o), true) => ctx.add_variable_from_value(
                        "oldSelf",
                        cel::Value::Opaque(Arc::new(OptionalValue::of(o.clone()))),
                    ),
                    (None, true) => ctx.add_variable_from_value(
                        "oldSelf",
                        cel::Value::Opaque(Arc::new(OptionalValue::none())),
                    ),
                    (None, false) => continue,
                }
            }
            let err_path = match rule.field_path {
                Some(fp) => append_field_path(path, s, fp),
                None => path.clone(),
            };
            match execute(&program, &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => {
                    let detail = message(&rule, &ctx);
                    errs.push(failure(&err_path, &rule, type_name, detail));
                }
                Ok(_) => {
                    let detail = format!("rule did not evaluate to a bool: {}", rule.rule.trim());
                    errs.push(invalid(&err_path, type_name, detail));
                }
                Err(e) => {
                    let detail =
                        format!("{} evaluating rule: {}", lower_first(&e), rule.rule.trim());
                    errs.push(invalid(&err_path, type_name, detail));
                }
            }
        }
    });
}

/// Lower-cases the first letter of an interpreter error, as cel-go words them
/// (`no such key: x`).
fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The error field of a path: apimachinery rendering, `<nil>` at the root.
fn field_name(path: &Path) -> String {
    if path.is_root() {
        "<nil>".to_string()
    } else {
        path.bracketed()
    }
}

fn invalid(path: &Path, type_name: &str, detail: String) -> FieldError {
    FieldError::new(
        field_name(path),
        FieldErrorKind::Invalid,
        Some(Value::String(type_name.to_string())),
        detail,
    )
}

/// The error for a rule that evaluated to `false`, shaped by `reason`.
fn failure(path: &Path, rule: &Rule<'_>, type_name: &str, detail: String) -> FieldError {
    let field = field_name(path);
    match rule.reason {
        Some("FieldValueForbidden") => FieldError::forbidden(field, detail),
        Some("FieldValueRequired") => FieldError::required(field, detail),
        Some("FieldValueDuplicate") => FieldError::new(
            field,
            FieldErrorKind::Duplicate,
            Some(Value::String(type_name.to_string())),
            "",
        ),
        _ => invalid(path, type_name, detail),
    }
}

/// `messageExpression` result when it is a non-empty single-line string,
/// else the trimmed `message`, else `failed rule: <rule>`.
fn message(rule: &Rule<'_>, ctx: &Context<'_>) -> String {
    if let Some(expr) = rule.message_expression {
        if let Ok(p) = compile(expr) {
            if let Ok(cel::Value::String(m)) = execute(&p, ctx) {
                let m = m.trim();
                if !m.is_empty() && !m.contains('\n') {
                    return m.to_string();
                }
            }
        }
    }
    match rule.message.map(str::trim) {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => format!("failed rule: {}", rule.rule.trim()),
    }
}

/// Appends a rule's `fieldPath` (`.a.b`, `['a.b']`, `.list[0]`) to the node
/// path, using the schema to tell declared properties from map keys.
fn append_field_path(base: &Path, schema: &Value, fp: &str) -> Path {
    let mut path = base.clone();
    let mut s = Some(schema);
    let mut rest = fp.trim();
    while !rest.is_empty() {
        let name: String;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            name = r[..end].to_string();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { break };
            let inner = r[..end].trim();
            rest = &r[end + 1..];
            if let Ok(i) = inner.parse::<usize>() {
                path = path.index(i);
                s = s.and_then(node::items);
                continue;
            }
            name = inner.trim_matches(|c| c == '\'' || c == '"').to_string();
        } else {
            break;
        }
        match s {
            Some(cur) if node::property(cur, &name).is_none() => {
                if let Additional::Schema(a) = node::additional(cur) {
                    path = path.key(&name);
                    s = Some(a);
                    continue;
                }
                path = path.field(&name);
                s = None;
            }
            Some(cur) => {
                path = path.field(&name);
                s = node::property(cur, &name);
            }
            None => path = path.field(&name),
        }
    }
    path
}

/// Why an expression outside a schema (an authentication configuration's claim mappings and
/// rules) could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression does not compile.
    #[error("compilation failed: {0}")]
    Compile(String),
    /// Evaluating it failed.
    #[error("{0}")]
    Eval(String),
}

/// Checks that `src` compiles (the program stays in this thread's cache).
pub fn check_expression(src: &str) -> Result<(), CelError> {
    compile(src).map(|_| ()).map_err(CelError::Compile)
}

/// A JSON value as CEL sees it without a schema, for [`evaluate_values`]: converted once, it
/// serves every expression evaluated over it.
pub fn cel_value(v: &Value) -> cel::Value {
    to_cel(v, None, false)
}

/// Evaluates `src` with the given variables (JSON values, converted without a schema).
pub fn evaluate(src: &str, vars: &[(&str, &Value)]) -> Result<cel::Value, CelError> {
    let vars: Vec<(&str, cel::Value)> = vars.iter().map(|(n, v)| (*n, cel_value(v))).collect();
    evaluate_values(src, &vars)
}

/// Evaluates `src` with the given variables, already CEL values ([`cel_value`]).
pub fn evaluate_values(src: &str, vars: &[(&str, cel::Value)]) -> Result<cel::Value, CelError> {
    let program = compile(src).map_err(CelError::Compile)?;
    BASE.with(|base| {
        let mut ctx = base.new_inner_scope();
        for (name, value) in vars {
            ctx.add_variable_from_value(*name, value.clone());
        }
        execute(&program, &ctx).map_err(CelError::Eval)
    })
}
