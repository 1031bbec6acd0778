//! Executing a parsed template against data.

use std::rc::Rc;

use super::funcs;
use super::parse::{Arg, Branch, Cmd, Node, Pipe, Pos, Tree};
use super::value::{format_v, V};
use super::{Error, MissingKey, Options};

/// Nested `template` calls allowed (Go allows far more; Rust's stack is the limit here).
const MAX_DEPTH: usize = 200;
/// Largest output, and most iterations of `range <int>`, so no template exhausts memory.
const MAX_OUTPUT: usize = 64 << 20;
const MAX_RANGE_INT: i64 = 1_000_000;

enum Flow {
    Normal,
    Break,
    Continue,
}

pub struct Exec<'a> {
    pub name: &'a str,
    pub tree: &'a Tree,
    pub opts: &'a Options,
    pub out: String,
    vars: Vec<(String, V)>,
    depth: usize,
    /// The last data path that had no value, for the error when it is printed.
    missing: Option<String>,
}

/// Where an error happened.
struct At<'s> {
    pos: Pos,
    src: &'s str,
}

impl<'a> Exec<'a> {
    pub fn new(name: &'a str, tree: &'a Tree, opts: &'a Options, root: V) -> Self {
        Exec {
            name,
            tree,
            opts,
            out: String::new(),
            vars: vec![("$".to_string(), root)],
            depth: 0,
            missing: None,
        }
    }

    fn err(&self, at: &At<'_>, message: impl Into<String>) -> Error {
        Error::exec(self.name, at.pos, at.src, message)
    }

    pub fn run(&mut self) -> Result<(), Error> {
        let dot = self.vars[0].1.clone();
        let root = &self.tree.root;
        self.walk(&dot, root).map(|_| ())
    }

    fn walk(&mut self, dot: &V, nodes: &[Node]) -> Result<Flow, Error> {
        let mark = self.vars.len();
        let flow = self.walk_inner(dot, nodes);
        self.vars.truncate(mark);
        flow
    }

    fn walk_inner(&mut self, dot: &V, nodes: &[Node]) -> Result<Flow, Error> {
        for node in nodes {
            match node {
                Node::Text(t) => self.emit(t, Pos::default())?,
                Node::Action { pos, src, pipe } => {
                    let at = At { pos: *pos, src };
                    let v = self.pipe(dot, pipe)?;
                    if pipe.decl.is_empty() {
                        self.print(&at, &v)?;
                    }
                }
                Node::If(b) | Node::With(b) => {
                    let v = self.pipe(dot, &b.pipe)?;
                    // `with` runs its body with the value as dot; `if` keeps dot.
                    let inner = if matches!(node, Node::With(_)) {
                        &v
                    } else {
                        dot
                    };
                    let flow = match (v.truth(), &b.otherwise) {
                        (true, _) => self.walk(inner, &b.body)?,
                        (false, Some(els)) => self.walk(dot, els)?,
                        (false, None) => Flow::Normal,
                    };
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range(b) => self.range(dot, b)?,
                Node::Template {
                    pos,
                    src,
                    name,
                    pipe,
                } => {
                    let at = At { pos: *pos, src };
                    let Some(body) = self.tree.defines.get(name) else {
                        return Err(self.err(&at, format!("template {name:?} not defined")));
                    };
                    let arg = match pipe {
                        Some(p) => self.pipe(dot, p)?,
                        None => V::Nil,
                    };
                    if self.depth >= MAX_DEPTH {
                        return Err(self.err(
                            &at,
                            format!("exceeded maximum template depth ({MAX_DEPTH})"),
                        ));
                    }
                    self.depth += 1;
                    let saved =
                        std::mem::replace(&mut self.vars, vec![("$".to_string(), arg.clone())]);
                    let result = self.walk(&arg, body);
                    self.vars = saved;
                    self.depth -= 1;
                    result?;
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    fn emit(&mut self, s: &str, pos: Pos) -> Result<(), Error> {
        if self.out.len() + s.len() > MAX_OUTPUT {
            return Err(Error::exec(
                self.name,
                pos,
                "",
                format!("output exceeds {} MiB", MAX_OUTPUT >> 20),
            ));
        }
        self.out.push_str(s);
        Ok(())
    }

    fn print(&mut self, at: &At<'_>, v: &V) -> Result<(), Error> {
        match v {
            V::Missing | V::Nil => match self.opts.missing_key {
                MissingKey::Strict => {
                    let what = match (v, self.missing.take()) {
                        (V::Missing, Some(path)) => format!("map has no entry for key {path:?}"),
                        (V::Missing, None) => "no value".to_string(),
                        _ => "the value is null".to_string(),
                    };
                    Err(self.err(
                        at,
                        format!("{what}; printing it would write \"<no value>\" (use default, if or with)"),
                    ))
                }
                _ => self.emit("<no value>", at.pos),
            },
            other => {
                let mut s = String::new();
                format_v(other, &mut s);
                self.emit(&s, at.pos)
            }
        }
    }

    fn range(&mut self, dot: &V, b: &Branch) -> Result<(), Error> {
        let at = At {
            pos: b.pos,
            src: &b.pipe.src,
        };
        // The declared variables belong to the body: evaluate without declaring.
        let undeclared = Pipe {
            decl: Vec::new(),
            assign: false,
            ..b.pipe.clone()
        };
        let v = self.pipe(dot, &undeclared)?;
        let items: Vec<(V, V)> = match &v {
            V::List(l) => l
                .iter()
                .enumerate()
                .map(|(i, x)| (V::Int(i as i64), x.clone()))
                .collect(),
            V::Map(m) => m
                .iter()
                .map(|(k, x)| (V::str(k.clone()), x.clone()))
                .collect(),
            V::Int(n) => {
                if *n > MAX_RANGE_INT {
                    return Err(self.err(&at, format!("range over {n} exceeds {MAX_RANGE_INT}")));
                }
                (0..(*n).max(0)).map(|i| (V::Int(i), V::Int(i))).collect()
            }
            V::Missing | V::Nil => Vec::new(),
            other => {
                return Err(self.err(
                    &at,
                    format!(
                        "range can't iterate over {}",
                        super::value::to_v_string(other)
                    ),
                ))
            }
        };
        if items.is_empty() {
            if let Some(els) = &b.otherwise {
                self.walk(dot, els)?;
            }
            return Ok(());
        }
        for (key, item) in items {
            let mark = self.vars.len();
            match b.pipe.decl.as_slice() {
                [] => {}
                [v] => self.vars.push((v.clone(), item.clone())),
                [k, v, ..] => {
                    self.vars.push((k.clone(), key));
                    self.vars.push((v.clone(), item.clone()));
                }
            }
            let flow = self.walk(&item, &b.body);
            self.vars.truncate(mark);
            match flow? {
                Flow::Break => break,
                Flow::Normal | Flow::Continue => {}
            }
        }
        Ok(())
    }

    pub fn pipe(&mut self, dot: &V, pipe: &Pipe) -> Result<V, Error> {
        let mut value: Option<V> = None;
        for cmd in &pipe.cmds {
            value = Some(self.cmd(dot, cmd, value)?);
        }
        let value = value.unwrap_or(V::Missing);
        if !pipe.decl.is_empty() {
            let at = At {
                pos: pipe.pos,
                src: &pipe.src,
            };
            let name = &pipe.decl[0];
            if pipe.assign {
                match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                    Some(slot) => slot.1 = value.clone(),
                    None => return Err(self.err(&at, format!("undefined variable: {name}"))),
                }
            } else {
                self.vars.push((name.clone(), value.clone()));
            }
        }
        Ok(value)
    }

    fn cmd(&mut self, dot: &V, cmd: &Cmd, piped: Option<V>) -> Result<V, Error> {
        let at = At {
            pos: cmd.pos,
            src: &cmd.src,
        };
        let Some(Arg::Func(name)) = cmd.args.first() else {
            if cmd.args.len() > 1 || piped.is_some() {
                return Err(self.err(&at, "can't give argument to non-function"));
            }
            return self.arg(dot, &cmd.args[0], &at);
        };
        let rest = &cmd.args[1..];
        // and/or/not evaluate lazily, as Go's builtins do, and return the deciding value.
        match name.as_str() {
            "and" | "or" => {
                let count = rest.len() + usize::from(piped.is_some());
                if count == 0 {
                    return Err(self.err(
                        &at,
                        format!("wrong number of args for {name}: want at least 1 got 0"),
                    ));
                }
                let mut last = V::Missing;
                for a in rest {
                    last = self.arg(dot, a, &at)?;
                    if (name == "and") != last.truth() {
                        return Ok(last);
                    }
                }
                if let Some(p) = piped {
                    last = p;
                }
                return Ok(last);
            }
            "not" => {
                let count = rest.len() + usize::from(piped.is_some());
                if count != 1 {
                    return Err(self.err(
                        &at,
                        format!("wrong number of args for not: want 1 got {count}"),
                    ));
                }
                let v = match piped {
                    Some(p) => p,
                    None => self.arg(dot, &rest[0], &at)?,
                };
                return Ok(V::Bool(!v.truth()));
            }
            _ => {}
        }
        let mut args = Vec::with_capacity(rest.len() + 1);
        for a in rest {
            args.push(self.arg(dot, a, &at)?);
        }
        if let Some(p) = piped {
            args.push(p);
        }
        if self.opts.missing_key == MissingKey::Strict && name != "default" {
            if let Some(i) = args.iter().position(|a| matches!(a, V::Missing)) {
                let path = self
                    .missing
                    .take()
                    .unwrap_or_else(|| format!("argument {}", i + 1));
                return Err(self.err(
                    &at,
                    format!("error calling {name}: map has no entry for key {path:?} (use default, if or with)"),
                ));
            }
        }
        let mixed = self.opts.numbers == super::Numbers::Exact;
        funcs::call(name, &args, mixed).map_err(|e| {
            let e = if e.starts_with("error calling") || e.starts_with("wrong number") {
                e
            } else {
                format!("error calling {name}: {e}")
            };
            self.err(&at, e)
        })
    }

    fn arg(&mut self, dot: &V, arg: &Arg, at: &At<'_>) -> Result<V, Error> {
        match arg {
            Arg::Dot => Ok(dot.clone()),
            Arg::Nil => Err(self.err(at, "nil is not a command")),
            Arg::Bool(b) => Ok(V::Bool(*b)),
            Arg::Int(i) => Ok(V::Int(*i)),
            Arg::Float(f) => Ok(V::Float(*f)),
            Arg::Str(s) => Ok(V::Str(Rc::from(s.as_str()))),
            Arg::Field(fields) => self.fields(dot.clone(), "", fields, at),
            Arg::Var(name, fields) => {
                let Some(v) = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                else {
                    return Err(self.err(at, format!("undefined variable: {name}")));
                };
                self.fields(v, name, fields, at)
            }
            Arg::Func(name) => {
                // A function used as an argument is called without arguments.
                let mixed = self.opts.numbers == super::Numbers::Exact;
                funcs::call(name, &[], mixed).map_err(|e| self.err(at, e))
            }
            Arg::Sub(pipe, fields) => {
                let v = self.pipe(dot, pipe)?;
                self.fields(v, "(...)", fields, at)
            }
        }
    }

    /// Follows `.a.b.c` from `v`: a missing key gives no value (and so does any field of no value,
    /// as in Go); a field of null is an error; `missingkey=error` makes a missing key an error.
    fn fields(
        &mut self,
        mut v: V,
        prefix: &str,
        fields: &[String],
        at: &At<'_>,
    ) -> Result<V, Error> {
        let mut path = prefix.to_string();
        for f in fields {
            path.push('.');
            path.push_str(f);
            v = match &v {
                V::Map(m) => match m.get(f) {
                    Some(x) => x.clone(),
                    None => {
                        if self.opts.missing_key == MissingKey::Error {
                            return Err(self.err(at, format!("map has no entry for key {f:?}")));
                        }
                        self.missing = Some(path.clone());
                        V::Missing
                    }
                },
                V::Missing => V::Missing,
                V::Nil => {
                    return Err(self.err(at, format!("nil pointer evaluating interface {{}}.{f}")))
                }
                other => {
                    return Err(self.err(
                        at,
                        format!("can't evaluate field {f} in type {}", other.type_name()),
                    ))
                }
            };
        }
        if !matches!(v, V::Missing) && !fields.is_empty() {
            self.missing = None;
        }
        Ok(v)
    }
}
