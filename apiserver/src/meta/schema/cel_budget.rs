//! The runtime cost budget of CEL evaluation. The interpreter has no cost hook, so a copy of
//! each compiled expression is rewritten to charge a per-thread counter as it runs:
//!
//! * every comprehension step becomes `_?_:_(__cost_tick(), step, false)`: the tick charges 1
//!   and fails once the counter is over its limit, before the step is evaluated;
//! * the range of every comprehension, every field selection and the arguments and receivers of
//!   size-dependent calls are wrapped in `__cost_size(x)`, which charges `1 + len/10` for a
//!   string or bytes and `1 + the number of values inside` for a list or map (the interpreter
//!   copies what it selects, so this charges what the copy costs) and returns `x` unchanged.
//!
//! Nothing is wrapped inside `has()`, nor the operands of the short-circuiting operators, so
//! the rewritten expression means what the original does. Limits are kube's:
//! [`PER_CALL_LIMIT`] per evaluation, [`RUNTIME_CEL_COST_BUDGET`] for all the rules of one
//! object. The units are not cel-go's exactly (cel-go charges every operation; this charges
//! iterations and sizes), but they scale with the work done, which is what the limit is for.

use std::cell::Cell;

use kube_cel::cel::common::ast::{operators, CallExpr, Expr, IdedExpr};
use kube_cel::cel::{Context, ExecutionError, Value};

/// Most one evaluation may cost (kube's `PerCallLimit`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// Most all the rules of one object may cost together (kube's `RuntimeCELCostBudget`).
pub const RUNTIME_CEL_COST_BUDGET: u64 = 10_000_000;

/// The error an evaluation over its limit ends with, as cel-go words it.
pub const COST_LIMIT_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

const TICK: &str = "__cost_tick";
const SIZE: &str = "__cost_size";

/// Function namespaces of the libraries: `math.greatest(...)` is a call with receiver `math`,
/// which must stay a bare identifier for the interpreter to find the function.
const NAMESPACES: &[&str] = &[
    "math",
    "strings",
    "sets",
    "lists",
    "format",
    "ip",
    "jsonpatch",
];

thread_local! {
    static SPENT: Cell<u64> = const { Cell::new(0) };
    static LIMIT: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Starts metering one evaluation that may cost `limit`.
pub(crate) fn start(limit: u64) {
    SPENT.with(|s| s.set(0));
    LIMIT.with(|l| l.set(limit));
}

/// What the evaluation started by [`start`] has cost so far.
pub(crate) fn spent() -> u64 {
    SPENT.with(Cell::get)
}

/// Whether the evaluation went over its limit.
pub(crate) fn exceeded() -> bool {
    spent() > LIMIT.with(Cell::get)
}

fn charge(n: u64) -> Result<(), ExecutionError> {
    let total = SPENT.with(|s| {
        let t = s.get().saturating_add(n);
        s.set(t);
        t
    });
    if total > LIMIT.with(Cell::get) {
        Err(ExecutionError::function_error(TICK, COST_LIMIT_EXCEEDED))
    } else {
        Ok(())
    }
}

/// The amount of values inside `v`, counting nested lists and maps, charged as the cost of
/// copying it.
fn weight(v: &Value) -> u64 {
    match v {
        Value::String(s) => 1 + s.len() as u64 / 10,
        Value::Bytes(b) => 1 + b.len() as u64 / 10,
        Value::List(l) => l.iter().fold(1u64, |acc, x| acc.saturating_add(weight(x))),
        Value::Map(m) => m
            .map
            .values()
            .fold(1u64, |acc, x| acc.saturating_add(weight(x))),
        _ => 1,
    }
}

/// Adds the metering functions to a base context.
pub(crate) fn register(ctx: &mut Context<'static>) {
    ctx.add_function(TICK, || -> Result<Value, ExecutionError> {
        charge(1).map(|()| Value::Bool(true))
    });
    ctx.add_function(SIZE, |v: Value| -> Result<Value, ExecutionError> {
        charge(weight(&v)).map(|()| v)
    });
}

fn call(name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Call(CallExpr {
            func_name: name.to_string(),
            target: None,
            args,
        }),
    }
}

fn sized(e: IdedExpr) -> IdedExpr {
    match &e.expr {
        Expr::Literal(_) => e,
        Expr::Ident(n) if NAMESPACES.contains(&n.as_str()) => e,
        _ => call(SIZE, vec![e]),
    }
}

/// A metered copy of a compiled expression.
pub(crate) fn instrument(e: &IdedExpr) -> IdedExpr {
    let mut e = e.clone();
    rewrite(&mut e);
    e
}

/// Functions whose cost does not depend on the size of their operands.
fn constant_cost(name: &str) -> bool {
    matches!(
        name,
        "size" | "has" | "type" | "int" | "uint" | "double" | "bool" | "dyn"
    ) || name == operators::NEGATE
        || name == operators::INDEX
        || name == operators::OPT_INDEX
        || name == TICK
        || name == SIZE
}

fn rewrite(e: &mut IdedExpr) {
    match &mut e.expr {
        Expr::Comprehension(c) => {
            rewrite(&mut c.iter_range);
            rewrite(&mut c.accu_init);
            rewrite(&mut c.loop_cond);
            rewrite(&mut c.loop_step);
            rewrite(&mut c.result);
            c.iter_range = sized(std::mem::take(&mut c.iter_range));
            let step = std::mem::take(&mut c.loop_step);
            c.loop_step = call(
                operators::CONDITIONAL,
                vec![
                    call(TICK, Vec::new()),
                    step,
                    IdedExpr {
                        id: 0,
                        expr: Expr::Literal(kube_cel::cel::common::ast::LiteralValue::Boolean(
                            false.into(),
                        )),
                    },
                ],
            );
        }
        Expr::Select(sel) => {
            if sel.test {
                // `has(a.b)`: the operand chain stays as parsed.
                return;
            }
            rewrite(&mut sel.operand);
            let inner = std::mem::take(e);
            *e = call(SIZE, vec![inner]);
        }
        Expr::Call(c) => {
            let name = c.func_name.clone();
            if let Some(t) = c.target.as_deref_mut() {
                rewrite(t);
            }
            for a in c.args.iter_mut() {
                rewrite(a);
            }
            let structural = name == operators::LOGICAL_AND
                || name == operators::LOGICAL_OR
                || name == operators::CONDITIONAL
                || name == operators::NOT_STRICTLY_FALSE
                || name == operators::LOGICAL_NOT;
            if structural || constant_cost(&name) {
                return;
            }
            if name == operators::OPT_SELECT {
                if let Some(a) = c.args.first_mut() {
                    *a = sized(std::mem::take(a));
                }
                return;
            }
            if let Some(t) = c.target.take() {
                c.target = Some(Box::new(sized(*t)));
            }
            for a in c.args.iter_mut() {
                *a = sized(std::mem::take(a));
            }
        }
        Expr::List(l) => l.elements.iter_mut().for_each(rewrite),
        Expr::Map(m) => {
            for entry in m.entries.iter_mut() {
                if let kube_cel::cel::common::ast::EntryExpr::MapEntry(me) = &mut entry.expr {
                    rewrite(&mut me.key);
                    rewrite(&mut me.value);
                }
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Struct(_) | Expr::Unspecified => {}
    }
}
