//! Static cost estimation of CEL expressions at write time, so that a CRD (or an
//! APIResourceSchema, or an authentication configuration) whose rules could cost too much is
//! refused before any object is validated with them, as kube-apiserver refuses it.
//!
//! How this follows kube-apiserver (`apiextensions` CRD validation over cel-go's estimator) and
//! where it differs:
//!
//! * **Sizes** come from the schema of the node a value sits on: `maxItems`, `maxProperties`,
//!   `maxLength`, as kube. Where one is absent kube assumes the worst case a 3 MiB request allows:
//!   `(3 MiB - 2) / (min + 1)` items for a list whose items serialize to at least `min` bytes,
//!   `(3 MiB - 2) / (min + 4)` entries for a map (a key `""` and `:` beside every value), and
//!   `3 MiB - 2` characters for a string. The smallest serialized sizes are kube's: 1 for a
//!   number, 4 for a boolean, 2 for a string, list or object; unlike kube this ignores string
//!   formats (`date-time` is costed as any string) and `minLength`/`minItems`, so it can only
//!   over-estimate an unbounded collection.
//! * **Costs** follow cel-go's estimator in shape, not in every constant: an identifier or a
//!   field selection costs 1, a literal 0, a call the sum of its arguments plus its own cost; a
//!   comprehension (the expanded `all`, `exists`, `map`, `filter`, ...) costs its range plus
//!   `range size × (condition + step)` plus its result, so nested comprehensions multiply.
//!   Size-dependent functions cost `1 + size/10` over strings (`+`, comparisons, `startsWith`,
//!   case and trim functions, conversions), `1 + size` over lists (`in`, `sum`, `sort`, ...),
//!   `contains` the product of both string sizes over 10 and `matches` the product of the
//!   string and pattern costs, as cel-go. Functions it does not know cost `1 + size/10` of their
//!   receiver. Both branches of `_?_:_` are costed at the dearer one.
//! * **Cardinality**: a rule runs once per value of its node, so its cost is multiplied by the
//!   product of the `maxItems`/`maxProperties` of its list and map ancestors; when one of them is
//!   unbounded, by `3 MiB / (min + 1)` for the node's own smallest serialized size, as kube.
//! * **Limits** are kube's: [`STATIC_ESTIMATED_COST_LIMIT`] per rule (with its cardinality) and
//!   [`STATIC_ESTIMATED_CRD_COST_LIMIT`] for all the rules of one version's schema, refused with
//!   kube's `Forbidden` texts at kube's field paths. `messageExpression`s are estimated the same
//!   way and count towards the total, as kube.
//! * **Authentication expressions** (`claims`, `user`) have no schema: every value there is
//!   costed as if it filled the 1 MiB of request headers a token can occupy, and each expression
//!   may cost [`STATIC_ESTIMATED_COST_LIMIT`] (kube sets no static limit there; it relies on its
//!   per-call runtime limit alone, which applies here too).

use kube_cel::cel::common::ast::{operators, Expr, IdedExpr, LiteralValue};
use serde_json::Value;

use super::node::{self, Additional};
use crate::meta::field_error::FieldError;

/// Most a single rule may be estimated to cost, cardinality included (kube's
/// `StaticEstimatedCostLimit`).
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;
/// Most all the rules of one version's schema may be estimated to cost together (kube's
/// `StaticEstimatedCRDCostLimit`).
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;
/// The largest request body; unbounded collections are costed as if they filled it.
const MAX_REQUEST_BYTES: u64 = 3 * 1024 * 1024;
/// The largest request headers; authentication claims are costed as if they filled them.
const MAX_HEADER_BYTES: u64 = 1024 * 1024;
/// Deepest expression or schema the estimator descends into (deeper is costed as unbounded).
const MAX_DEPTH: usize = 128;

/// What a sub-expression is known to be.
#[derive(Clone, Debug)]
enum Shape<'s> {
    /// A value described by a schema node.
    Schema(&'s Value),
    /// A list (literal or built by a comprehension) of values of this shape.
    List(Box<Shape<'s>>),
    /// A string (literal, map key or function result).
    Str,
    /// A scalar that is not a string.
    Scalar,
    /// Anything, of any size the limit of its source allows.
    Dyn,
}

/// The estimate of one sub-expression: its most cost, and its largest size (items of a list or
/// map, characters of a string, 1 for other scalars).
#[derive(Clone, Debug)]
struct Estimate<'s> {
    cost: u64,
    size: u64,
    shape: Shape<'s>,
}

/// The estimator over one expression: the shapes of its variables and how large an unknown
/// value may be.
struct Estimator<'s> {
    vars: Vec<(String, Estimate<'s>)>,
    unbounded: u64,
}

impl<'s> Estimator<'s> {
    fn scalar(&self, cost: u64) -> Estimate<'s> {
        Estimate {
            cost,
            size: 1,
            shape: Shape::Scalar,
        }
    }

    fn of_shape(&self, cost: u64, shape: Shape<'s>) -> Estimate<'s> {
        let size = match &shape {
            Shape::Schema(s) => schema_size(s, self.unbounded),
            Shape::Str | Shape::Dyn => self.unbounded,
            // At least a byte and a comma each.
            Shape::List(_) => self.unbounded / 2,
            Shape::Scalar => 1,
        };
        Estimate { cost, size, shape }
    }

    /// The shape of one element when iterating (list items, map keys).
    fn element(&self, e: &Estimate<'s>) -> Estimate<'s> {
        match &e.shape {
            Shape::List(inner) => self.of_shape(0, (**inner).clone()),
            Shape::Schema(s) => match node::ty(s) {
                Some("array") => match node::items(s) {
                    Some(i) => self.of_shape(0, Shape::Schema(i)),
                    None => self.of_shape(0, Shape::Dyn),
                },
                // Map keys: strings no schema bounds.
                Some("object") => Estimate {
                    cost: 0,
                    size: self.unbounded.saturating_sub(2),
                    shape: Shape::Str,
                },
                _ => self.of_shape(0, Shape::Dyn),
            },
            // Items of unknown size: together they fill at most what the range can hold, so
            // the more of them, the smaller each (which is the dearer case for a loop).
            _ => Estimate {
                cost: 0,
                size: (self.unbounded / e.size.max(1)).max(1),
                shape: Shape::Dyn,
            },
        }
    }

    /// The shape of `v.field` or `v[key]`.
    fn member(&self, e: &Estimate<'s>, field: Option<&str>) -> Shape<'s> {
        match &e.shape {
            Shape::Schema(s) => match node::ty(s) {
                Some("array") => node::items(s).map_or(Shape::Dyn, Shape::Schema),
                _ => {
                    if let Some(p) = field.and_then(|f| node::property(s, f)) {
                        return Shape::Schema(p);
                    }
                    match node::additional(s) {
                        Additional::Schema(a) => Shape::Schema(a),
                        _ => Shape::Dyn,
                    }
                }
            },
            Shape::List(inner) => (**inner).clone(),
            _ => Shape::Dyn,
        }
    }

    fn estimate(&mut self, e: &IdedExpr, depth: usize) -> Estimate<'s> {
        if depth > MAX_DEPTH {
            return Estimate {
                cost: u64::MAX,
                size: self.unbounded,
                shape: Shape::Dyn,
            };
        }
        match &e.expr {
            Expr::Literal(l) => match l {
                LiteralValue::String(s) => Estimate {
                    cost: 0,
                    size: s.inner().chars().count() as u64,
                    shape: Shape::Str,
                },
                LiteralValue::Bytes(b) => Estimate {
                    cost: 0,
                    size: b.inner().len() as u64,
                    shape: Shape::Str,
                },
                _ => self.scalar(0),
            },
            Expr::Ident(name) => match self.vars.iter().rev().find(|(n, _)| n == name) {
                Some((_, v)) => Estimate {
                    cost: 1,
                    ..v.clone()
                },
                None => self.of_shape(1, Shape::Dyn),
            },
            Expr::Select(sel) => {
                let operand = self.estimate(&sel.operand, depth + 1);
                let cost = operand.cost.saturating_add(1);
                if sel.test {
                    self.scalar(cost)
                } else {
                    let shape = self.member(&operand, Some(&sel.field));
                    self.of_shape(cost, shape)
                }
            }
            Expr::List(list) => {
                let mut cost = 0u64;
                let mut shape = None;
                for x in &list.elements {
                    let est = self.estimate(x, depth + 1);
                    cost = cost.saturating_add(est.cost);
                    shape.get_or_insert(est.shape);
                }
                Estimate {
                    cost,
                    size: list.elements.len() as u64,
                    shape: Shape::List(Box::new(shape.unwrap_or(Shape::Dyn))),
                }
            }
            Expr::Map(map) => {
                let mut cost = 0u64;
                for entry in &map.entries {
                    if let kube_cel::cel::common::ast::EntryExpr::MapEntry(m) = &entry.expr {
                        cost = cost
                            .saturating_add(self.estimate(&m.key, depth + 1).cost)
                            .saturating_add(self.estimate(&m.value, depth + 1).cost);
                    }
                }
                Estimate {
                    cost,
                    size: map.entries.len() as u64,
                    shape: Shape::Dyn,
                }
            }
            Expr::Struct(_) | Expr::Unspecified => self.scalar(1),
            Expr::Comprehension(c) => {
                let range = self.estimate(&c.iter_range, depth + 1);
                let init = self.estimate(&c.accu_init, depth + 1);
                let element = self.element(&range);
                let accu = match &init.shape {
                    // `map`/`filter` build a list as long as the range at most.
                    Shape::List(_) => Estimate {
                        cost: 0,
                        size: range.size,
                        shape: Shape::List(Box::new(Shape::Dyn)),
                    },
                    _ => init.clone(),
                };
                let mark = self.vars.len();
                self.vars.push((c.accu_var.clone(), accu));
                match &c.iter_var2 {
                    // Two-variable forms: the index or key, then the value.
                    Some(second) => {
                        let key = match &range.shape {
                            Shape::Schema(s) if node::ty(s) == Some("object") => element.clone(),
                            _ => self.scalar(0),
                        };
                        let value = Estimate {
                            cost: 0,
                            size: 0,
                            shape: self.member(&range, None),
                        };
                        let value = self.of_shape(value.cost, value.shape);
                        self.vars.push((c.iter_var.clone(), key));
                        self.vars.push((second.clone(), value));
                    }
                    None => self.vars.push((c.iter_var.clone(), element)),
                }
                let cond = self.estimate(&c.loop_cond, depth + 1);
                let step = self.estimate(&c.loop_step, depth + 1);
                self.vars.truncate(mark + 1);
                let result = self.estimate(&c.result, depth + 1);
                self.vars.truncate(mark);
                let per_item = cond.cost.saturating_add(step.cost);
                Estimate {
                    cost: range
                        .cost
                        .saturating_add(init.cost)
                        .saturating_add(range.size.saturating_mul(per_item))
                        .saturating_add(result.cost),
                    size: result.size,
                    shape: result.shape,
                }
            }
            Expr::Call(call) => self.call(call, depth),
        }
    }

    fn call(&mut self, call: &kube_cel::cel::common::ast::CallExpr, depth: usize) -> Estimate<'s> {
        let target = call.target.as_ref().map(|t| self.estimate(t, depth + 1));
        let args: Vec<Estimate<'s>> = call
            .args
            .iter()
            .map(|a| self.estimate(a, depth + 1))
            .collect();
        let inputs = args
            .iter()
            .chain(target.iter())
            .fold(0u64, |acc, a| acc.saturating_add(a.cost));
        let name = call.func_name.as_str();
        if name == operators::CONDITIONAL && args.len() == 3 {
            let (a, b) = (&args[1], &args[2]);
            let dearer = if a.cost >= b.cost { a } else { b };
            return Estimate {
                cost: args[0].cost.saturating_add(dearer.cost),
                size: a.size.max(b.size),
                shape: dearer.shape.clone(),
            };
        }
        // The receiver and first argument, whichever form the call took.
        let first = target.as_ref().or(args.first());
        let second = if target.is_some() {
            args.first()
        } else {
            args.get(1)
        };
        let size = |e: Option<&Estimate<'s>>| e.map_or(0, |e| e.size);
        let tenth = |n: u64| n.div_ceil(10);
        let string_like = |e: Option<&Estimate<'s>>| match e.map(|e| &e.shape) {
            Some(Shape::Str) => true,
            Some(Shape::Schema(s)) => node::ty(s) == Some("string"),
            _ => false,
        };
        let collection = |e: Option<&Estimate<'s>>| match e.map(|e| &e.shape) {
            Some(Shape::List(_)) => true,
            Some(Shape::Schema(s)) => matches!(node::ty(s), Some("array") | Some("object")),
            _ => false,
        };
        let (own, result) = match name {
            // As cel-go: the short-circuiting operators cost only their operands.
            operators::LOGICAL_AND | operators::LOGICAL_OR => (0, self.scalar(0)),
            operators::LOGICAL_NOT
            | operators::NOT_STRICTLY_FALSE
            | operators::NEGATE
            | "size"
            | "has"
            | "type"
            | "int"
            | "uint"
            | "double"
            | "bool"
            | "dyn" => (1, self.scalar(0)),
            operators::ADD => {
                let total = size(first).saturating_add(size(second));
                let shape = first.map_or(Shape::Scalar, |e| e.shape.clone());
                let est = Estimate {
                    cost: 0,
                    size: total,
                    shape,
                };
                // Lists are concatenated without copying (cel-go charges 1); strings are copied.
                if collection(first) || collection(second) {
                    (1, est)
                } else {
                    (1 + tenth(total), est)
                }
            }
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS => {
                let smaller = size(first).min(size(second));
                let own = if string_like(first) || string_like(second) {
                    1 + tenth(smaller)
                } else if collection(first) && collection(second) {
                    1 + smaller
                } else {
                    1
                };
                (own, self.scalar(0))
            }
            operators::IN => {
                // `x in list` scans the list; `key in map` does not.
                let container = second;
                let own = match container.map(|c| &c.shape) {
                    Some(Shape::Schema(s)) if node::ty(s) == Some("object") => 1,
                    _ => 1 + size(container),
                };
                (own, self.scalar(0))
            }
            operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT => {
                let shape = first.map_or(Shape::Dyn, |e| self.member(e, None));
                (1, self.of_shape(0, shape))
            }
            "contains" => (
                1 + tenth(size(first).saturating_mul(size(second))),
                self.scalar(0),
            ),
            "matches" | "find" | "findAll" => {
                let text = 1 + tenth(size(first));
                let pattern = 1 + size(second).div_ceil(4);
                (text.saturating_mul(pattern), self.of_shape(0, Shape::Str))
            }
            "startsWith" | "endsWith" => (1 + tenth(size(second)), self.scalar(0)),
            "sum" | "min" | "max" | "isSorted" | "sort" | "distinct" | "flatten" | "reverse"
            | "slice" | "indexOf" | "lastIndexOf"
                if !string_like(first) =>
            {
                let est = first.cloned().unwrap_or_else(|| self.scalar(0));
                (1 + size(first), Estimate { cost: 0, ..est })
            }
            _ => {
                // String functions and conversions: linear in their receiver or argument.
                let n = size(first);
                let shape = if string_like(first) {
                    Shape::Str
                } else {
                    Shape::Dyn
                };
                (
                    1 + tenth(n),
                    Estimate {
                        cost: 0,
                        size: n,
                        shape,
                    },
                )
            }
        };
        Estimate {
            cost: inputs.saturating_add(own),
            ..result
        }
    }
}

/// The smallest size a value of this schema serializes to in JSON (kube's
/// `MinSerializedSize`).
fn min_serialized_size(s: &Value) -> u64 {
    match node::ty(s) {
        Some("boolean") => 4,
        Some("string") | Some("array") | Some("object") => 2,
        _ => 1,
    }
}

/// The most items, entries or characters a value of this schema can have.
fn schema_size(s: &Value, unbounded: u64) -> u64 {
    match node::ty(s) {
        Some("array") => node::count(s, "maxItems").unwrap_or_else(|| {
            let min = node::items(s).map_or(1, min_serialized_size);
            (unbounded.saturating_sub(2)) / (min + 1)
        }),
        Some("object") => match node::additional(s) {
            Additional::Absent => node::properties(s).map_or(0, |p| p.len() as u64),
            Additional::Any => {
                node::count(s, "maxProperties").unwrap_or_else(|| unbounded.saturating_sub(2) / 5)
            }
            Additional::Schema(a) => node::count(s, "maxProperties")
                .unwrap_or_else(|| unbounded.saturating_sub(2) / (min_serialized_size(a) + 4)),
        },
        Some("string") => node::count(s, "maxLength").unwrap_or(unbounded.saturating_sub(2)),
        Some(_) => 1,
        None => unbounded,
    }
}

/// Estimates the cost of one compiled expression whose `self` (and `oldSelf`) is described by
/// `schema`.
fn estimate_rule(expr: &IdedExpr, schema: &Value) -> u64 {
    let mut est = Estimator {
        vars: Vec::new(),
        unbounded: MAX_REQUEST_BYTES,
    };
    let this = est.of_shape(0, Shape::Schema(schema));
    est.vars.push(("self".into(), this.clone()));
    est.vars.push(("oldSelf".into(), this));
    est.estimate(expr, 0).cost
}

/// Estimates an expression without a schema, every variable costed as if it filled the 1 MiB
/// of request headers (authentication `claims` and `user`).
pub(crate) fn estimate_unbounded(expr: &IdedExpr) -> u64 {
    let mut est = Estimator {
        vars: Vec::new(),
        unbounded: MAX_HEADER_BYTES,
    };
    est.estimate(expr, 0).cost
}

/// kube's `exceeds budget by factor of …` sentence.
pub(crate) fn cost_error_message(cost_name: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{cost_name} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

/// The walk over one version's schema: where it is, and how many values a node can have.
struct SchemaWalk {
    errors: Vec<FieldError>,
    total: u64,
}

impl SchemaWalk {
    /// `card` is the product of the bounds of the list and map ancestors, `None` once one of
    /// them is unbounded.
    fn node(&mut self, s: &Value, field: &str, card: Option<u64>, depth: usize) {
        if depth > MAX_DEPTH || !s.is_object() {
            return;
        }
        if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
            let cardinality = card
                .unwrap_or_else(|| MAX_REQUEST_BYTES / (min_serialized_size(s) + 1))
                .max(1);
            for (j, rule) in rules.iter().enumerate() {
                let at = format!("{field}.x-kubernetes-validations[{j}]");
                self.rule(rule, s, &at, cardinality);
            }
        }
        if let Some(props) = node::properties(s) {
            for (k, p) in props {
                self.node(p, &format!("{field}.properties[{k}]"), card, depth + 1);
            }
        }
        if let Some(items) = node::items(s) {
            let n = node::count(s, "maxItems");
            let card = card.zip(n).map(|(c, n)| c.saturating_mul(n));
            self.node(items, &format!("{field}.items"), card, depth + 1);
        }
        if let Additional::Schema(a) = node::additional(s) {
            let n = node::count(s, "maxProperties");
            let card = card.zip(n).map(|(c, n)| c.saturating_mul(n));
            self.node(a, &format!("{field}.additionalProperties"), card, depth + 1);
        }
    }

    fn rule(&mut self, rule: &Value, s: &Value, at: &str, cardinality: u64) {
        let sources = [
            ("rule", "estimated rule cost"),
            ("messageExpression", "estimated messageExpression cost"),
        ];
        for (key, cost_name) in sources {
            let Some(src) = rule.get(key).and_then(Value::as_str) else {
                continue;
            };
            let field = format!("{at}.{key}");
            let program = match super::cel::compile(src) {
                Ok(p) => p,
                Err(e) => {
                    let what = if key == "rule" {
                        "compilation failed"
                    } else {
                        "messageExpression compilation failed"
                    };
                    self.errors
                        .push(FieldError::invalid(field, src, format!("{what}: {e}")));
                    continue;
                }
            };
            let cost = estimate_rule(program.expression(), s).saturating_mul(cardinality);
            if cost > STATIC_ESTIMATED_COST_LIMIT {
                self.errors.push(FieldError::forbidden(
                    field,
                    cost_error_message(cost_name, cost, STATIC_ESTIMATED_COST_LIMIT),
                ));
            }
            self.total = self.total.saturating_add(cost);
        }
    }
}

/// Checks every `x-kubernetes-validations` rule of one version's schema at write time: each
/// compiles and is estimated within [`STATIC_ESTIMATED_COST_LIMIT`], all of them together within
/// [`STATIC_ESTIMATED_CRD_COST_LIMIT`]. `field` names the schema in the errors
/// (`spec.versions[0].schema.openAPIV3Schema`).
///
/// ```ignore
/// let errs = check_rule_costs(&schema, "spec.versions[0].schema.openAPIV3Schema");
/// assert!(errs.is_empty());
/// ```
pub fn check_rule_costs(schema: &Value, field: &str) -> Vec<FieldError> {
    let mut walk = SchemaWalk {
        errors: Vec::new(),
        total: 0,
    };
    walk.node(schema, field, Some(1), 0);
    if walk.total > STATIC_ESTIMATED_CRD_COST_LIMIT {
        walk.errors.push(FieldError::forbidden(
            field,
            cost_error_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                walk.total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
    walk.errors
}
