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
//! * Every evaluation is metered ([`super::cel_budget`]): one may cost
//!   [`PER_CALL_LIMIT`] (beyond, the rule fails with `operation cancelled:
//!   actual cost limit exceeded evaluating rule: <rule>`), all of one
//!   object's rules [`RUNTIME_CEL_COST_BUDGET`] (beyond, `validation failed
//!   due to running out of cost budget, no further validation rules will be
//!   run` and no further rule runs), as kube.
//!
//! Compiled programs are cached per thread, beside their metered copy. The
//! interpreter is guarded against panics.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;

use kube_cel::cel::{self, objects::OptionalValue, Context, Program};
use kube_cel::KubeCelExt as _;
use serde_json::Value;

use super::cel_budget::{self, COST_LIMIT_EXCEEDED, PER_CALL_LIMIT, RUNTIME_CEL_COST_BUDGET};
use super::cel_value::to_cel;
use super::node::{self, Additional, MAX_DEPTH};
use super::path::Path;
use crate::meta::field_error::{FieldError, FieldErrorKind};

thread_local! {
    static BASE: Context<'static> = {
        let mut ctx = Context::default();
        ctx.register_all();
        cel_budget::register(&mut ctx);
        ctx
    };
    static PROGRAMS: RefCell<HashMap<String, Result<Rc<Compiled>, String>>> =
        RefCell::new(HashMap::new());
}

/// A compiled expression and the metered copy that is evaluated.
pub(super) struct Compiled {
    program: Program,
    metered: cel::common::ast::IdedExpr,
}

impl Compiled {
    /// The parsed expression, as written.
    pub(super) fn expression(&self) -> &cel::common::ast::IdedExpr {
        self.program.expression()
    }

    fn uses_old_self(&self) -> bool {
        self.program.references().has_variable("oldSelf")
    }
}

/// Compiles (or fetches from the per-thread cache) a CEL expression.
pub(super) fn compile(src: &str) -> Result<Rc<Compiled>, String> {
    PROGRAMS.with(|cache| {
        if let Some(p) = cache.borrow().get(src) {
            return p.clone();
        }
        let compiled = match catch_unwind(AssertUnwindSafe(|| Program::compile(src))) {
            Ok(Ok(program)) => {
                let metered = cel_budget::instrument(program.expression());
                Ok(Rc::new(Compiled { program, metered }))
            }
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

/// Runs a program's metered copy within `limit`, turning interpreter panics into errors; an
/// evaluation over its limit fails with [`COST_LIMIT_EXCEEDED`] whatever it returned. What it
/// cost is [`cel_budget::spent`] afterwards.
fn execute(p: &Compiled, ctx: &Context<'_>, limit: u64) -> Result<cel::Value, String> {
    cel_budget::start(limit);
    let result = match catch_unwind(AssertUnwindSafe(|| cel::Value::resolve(&p.metered, ctx))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("internal error in the CEL interpreter".to_string()),
    };
    if cel_budget::exceeded() {
        return Err(COST_LIMIT_EXCEEDED.to_string());
    }
    result
}

/// Parses a string with a CEL conversion function (`timestamp`, `duration`).
pub(crate) fn parse_with(func: &str, s: &str) -> Option<cel::Value> {
    let program = compile(&format!("{func}(x)")).ok()?;
    BASE.with(|base| {
        let mut ctx = base.new_inner_scope();
        ctx.add_variable_from_value("x", cel::Value::String(Arc::new(s.to_string())));
        execute(&program, &ctx, PER_CALL_LIMIT).ok()
    })
}

/// Evaluates every `x-kubernetes-validations` rule of `schema` against `obj`
/// (an entire object; `old` is the stored object on update, `None` on
/// create) and returns the failures.
pub fn validate_cel(obj: &Value, old: Option<&Value>, schema: &Value) -> Vec<FieldError> {
    validate_cel_within(obj, old, schema, RUNTIME_CEL_COST_BUDGET, PER_CALL_LIMIT)
}

/// [`validate_cel`] with the object's budget and the limit of one evaluation given.
pub(super) fn validate_cel_within(
    obj: &Value,
    old: Option<&Value>,
    schema: &Value,
    budget: u64,
    per_call: u64,
) -> Vec<FieldError> {
    let mut walk = Walk {
        errs: Vec::new(),
        remaining: Some(budget),
        per_call,
    };
    walk.node(obj, old, schema, &Path::root(), true, 0);
    walk.errs
}

/// kube's error once the object's budget is spent.
const OUT_OF_BUDGET: &str =
    "validation failed due to running out of cost budget, no further validation rules will be run";

/// One object's rule evaluation: its failures and what is left of its budget (`None` once
/// spent: nothing more runs).
struct Walk {
    errs: Vec<FieldError>,
    remaining: Option<u64>,
    per_call: u64,
}

impl Walk {
    fn node(
        &mut self,
        v: &Value,
        old: Option<&Value>,
        s: &Value,
        path: &Path,
        resource: bool,
        depth: usize,
    ) {
        if depth > MAX_DEPTH || v.is_null() || self.remaining.is_none() {
            return;
        }
        let old = old.filter(|o| !o.is_null());
        if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
            if !rules.is_empty() {
                self.run_rules(rules, v, old, s, path, resource);
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
                        self.node(child, old_child, ps, &p, node::embedded(ps), depth + 1);
                    } else if let Additional::Schema(a) = node::additional(s) {
                        let p = path.key(k);
                        self.node(child, old_child, a, &p, node::embedded(a), depth + 1);
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
                    self.node(x, old_x, items, &p, node::embedded(items), depth + 1);
                }
            }
            _ => {}
        }
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

impl Walk {
    /// Charges what the last evaluation cost; false (with kube's error at `path`) when it was more
    /// than the object had left.
    fn charge(&mut self, path: &Path, type_name: &str) -> bool {
        let Some(remaining) = self.remaining else {
            return false;
        };
        let cost = cel_budget::spent();
        if cost > remaining {
            self.remaining = None;
            self.errs
                .push(invalid(path, type_name, OUT_OF_BUDGET.to_string()));
            return false;
        }
        self.remaining = Some(remaining - cost);
        true
    }

    /// The limit of the next evaluation: the per-call limit, or what is left if less (one more
    /// unit tells an evaluation that needed more).
    fn limit(&self) -> u64 {
        self.per_call.min(self.remaining.unwrap_or(0))
    }

    fn run_rules(
        &mut self,
        rules: &[Value],
        v: &Value,
        old: Option<&Value>,
        s: &Value,
        path: &Path,
        resource: bool,
    ) {
        let type_name = node::ty(s).unwrap_or("");
        if self.remaining == Some(0) {
            self.remaining = None;
            self.errs
                .push(invalid(path, type_name, OUT_OF_BUDGET.to_string()));
            return;
        }
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
                        self.errs
                            .push(FieldError::internal(field_name(path), detail));
                        continue;
                    }
                };
                let transition = program.uses_old_self();
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
                let outcome = execute(&program, &ctx, self.limit());
                if !self.charge(path, type_name) {
                    break;
                }
                match outcome {
                    Ok(cel::Value::Bool(true)) => {}
                    Ok(cel::Value::Bool(false)) => {
                        let detail = message(&rule, &ctx, self.limit());
                        if !self.charge(path, type_name) {
                            break;
                        }
                        self.errs.push(failure(&err_path, &rule, type_name, detail));
                    }
                    Ok(_) => {
                        let detail =
                            format!("rule did not evaluate to a bool: {}", rule.rule.trim());
                        self.errs.push(invalid(&err_path, type_name, detail));
                    }
                    Err(e) => {
                        let detail =
                            format!("{} evaluating rule: {}", lower_first(&e), rule.rule.trim());
                        self.errs.push(invalid(&err_path, type_name, detail));
                    }
                }
            }
        });
    }
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
fn message(rule: &Rule<'_>, ctx: &Context<'_>, limit: u64) -> String {
    cel_budget::start(limit);
    if let Some(expr) = rule.message_expression {
        if let Ok(p) = compile(expr) {
            if let Ok(cel::Value::String(m)) = execute(&p, ctx, limit) {
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
    /// Its estimated cost is over [`super::STATIC_ESTIMATED_COST_LIMIT`].
    #[error("{0}")]
    Cost(String),
}

/// Checks that `src` compiles (the program stays in this thread's cache) and that its estimated
/// cost, every variable as large as a token's 1 MiB of headers allows, is within
/// [`super::STATIC_ESTIMATED_COST_LIMIT`].
pub fn check_expression(src: &str) -> Result<(), CelError> {
    let program = compile(src).map_err(CelError::Compile)?;
    let cost = super::cel_cost::estimate_unbounded(program.expression());
    let limit = super::cel_cost::STATIC_ESTIMATED_COST_LIMIT;
    if cost > limit {
        return Err(CelError::Cost(super::cel_cost::cost_error_message(
            "estimated cost",
            cost,
            limit,
        )));
    }
    Ok(())
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
        execute(&program, &ctx, PER_CALL_LIMIT).map_err(CelError::Eval)
    })
}
