//! Parsing Go `text/template` source into a tree: text, actions with pipelines, `if`/`else if`,
//! `range` (with `$i, $v :=`), `with`, `define`/`template`/`block`, `break`/`continue`,
//! comments and `{{-`/`-}}` whitespace trimming.

use std::collections::BTreeMap;

use super::Error;

/// A position in the source: 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

#[derive(Clone, Debug)]
pub enum Node {
    Text(String),
    /// `{{ pipeline }}`: prints the result unless the pipeline declares variables.
    Action {
        pos: Pos,
        src: String,
        pipe: Pipe,
    },
    If(Branch),
    Range(Branch),
    With(Branch),
    /// `{{ template "name" pipeline }}`.
    Template {
        pos: Pos,
        src: String,
        name: String,
        pipe: Option<Pipe>,
    },
    Break,
    Continue,
}

/// The shared shape of `if`, `range` and `with`.
#[derive(Clone, Debug)]
pub struct Branch {
    pub pos: Pos,
    pub pipe: Pipe,
    pub body: Vec<Node>,
    pub otherwise: Option<Vec<Node>>,
}

/// `$x := cmd | cmd ...` or `$x = ...` or just commands.
#[derive(Clone, Debug, Default)]
pub struct Pipe {
    pub pos: Pos,
    /// Source text of the pipeline, for error messages (`at <...>`).
    pub src: String,
    pub decl: Vec<String>,
    /// `=` (assign an existing variable) rather than `:=`.
    pub assign: bool,
    pub cmds: Vec<Cmd>,
}

#[derive(Clone, Debug)]
pub struct Cmd {
    pub pos: Pos,
    pub src: String,
    pub args: Vec<Arg>,
}

#[derive(Clone, Debug)]
pub enum Arg {
    /// `.`
    Dot,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// `.a.b` (fields of dot)
    Field(Vec<String>),
    /// `$x.a.b`
    Var(String, Vec<String>),
    /// A function name.
    Func(String),
    /// `(pipeline).a.b`
    Sub(Box<Pipe>, Vec<String>),
}

/// A parsed template set: the main tree and every `define`d one.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub root: Vec<Node>,
    pub defines: BTreeMap<String, Vec<Node>>,
}

/// One piece of the source after splitting at the delimiters.
enum Piece {
    Text(String),
    Action { body: String, pos: Pos },
}

/// Positions of byte offsets, computed incrementally: offsets asked for only grow, so the whole
/// source is scanned once however many actions it has.
struct Lines<'a> {
    text: &'a str,
    offset: usize,
    line: usize,
    line_start: usize,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Lines {
            text,
            offset: 0,
            line: 1,
            line_start: 0,
        }
    }

    fn pos(&mut self, offset: usize) -> Pos {
        if offset >= self.offset {
            for (i, b) in self.text.as_bytes()[self.offset..offset].iter().enumerate() {
                if *b == b'\n' {
                    self.line += 1;
                    self.line_start = self.offset + i + 1;
                }
            }
            self.offset = offset;
        }
        Pos {
            line: self.line,
            col: offset.saturating_sub(self.line_start) + 1,
        }
    }
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Splits the source into text and action bodies, applying trim markers and dropping comments.
fn split(name: &str, src: &str) -> Result<Vec<Piece>, Error> {
    let mut lines = Lines::new(src);
    let mut pieces = Vec::new();
    let mut rest = 0;
    let mut trim_next = false;
    while let Some(found) = src[rest..].find("{{") {
        let open = rest + found;
        let mut text = &src[rest..open];
        if trim_next {
            text = text.trim_start_matches(is_space);
        }
        let mut body_start = open + 2;
        let after = &src[body_start..];
        let trim_left = after.starts_with('-') && after[1..].starts_with(is_space);
        if trim_left {
            text = text.trim_end_matches(is_space);
            body_start += 1;
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text.to_string()));
        }
        // Find the closing delimiter outside of string literals and comments.
        let bytes = src.as_bytes();
        let mut i = body_start;
        let mut close = None;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                        if bytes[i] == b'\\' {
                            i += 1;
                        }
                        i += 1;
                    }
                }
                b'`' => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != b'`' {
                        i += 1;
                    }
                }
                b'/' if src[i..].starts_with("/*") => match src[i + 2..].find("*/") {
                    Some(end) => i += 2 + end + 1,
                    None => {
                        return Err(Error::parse(name, lines.pos(open).line, "unclosed comment"))
                    }
                },
                b'}' if src[i..].starts_with("}}") => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let Some(close) = close else {
            return Err(Error::parse(name, lines.pos(open).line, "unclosed action"));
        };
        let mut body_end = close;
        trim_next = false;
        let inner = &src[body_start..close];
        if inner.ends_with('-') && inner[..inner.len() - 1].ends_with(is_space) {
            trim_next = true;
            body_end -= 1;
        }
        let body = &src[body_start..body_end];
        let trimmed = body.trim();
        if trimmed.starts_with("/*") {
            if !trimmed.ends_with("*/") {
                return Err(Error::parse(
                    name,
                    lines.pos(open).line,
                    "comment ends before closing delimiter",
                ));
            }
        } else {
            pieces.push(Piece::Action {
                body: body.to_string(),
                pos: lines.pos(body_start + (body.len() - body.trim_start().len())),
            });
        }
        rest = close + 2;
    }
    let mut text = &src[rest..];
    if trim_next {
        text = text.trim_start_matches(is_space);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text.to_string()));
    }
    Ok(pieces)
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Dot,
    /// `.name`; `true` when it directly follows the previous token (`$x.a`, `.a.b`, `(...).a`).
    Field(String, bool),
    Var(String),
    Ident(String),
    Str(String),
    Num(String),
    Pipe,
    LParen,
    RParen,
    Declare,
    Assign,
    Comma,
}

/// Tokens of one action body, each with its byte offset in the body.
fn tokens(name: &str, line: usize, body: &str) -> Result<Vec<(Tok, usize)>, Error> {
    let err = |m: String| Error::parse(name, line, &m);
    let chars: Vec<(usize, char)> = body.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let (off, c) = chars[i];
        match c {
            c if is_space(c) => i += 1,
            '|' | '(' | ')' | ',' | '=' => {
                let tok = match c {
                    '|' => Tok::Pipe,
                    '(' => Tok::LParen,
                    ')' => Tok::RParen,
                    ',' => Tok::Comma,
                    _ => Tok::Assign,
                };
                out.push((tok, off));
                i += 1;
            }
            ':' if chars.get(i + 1).map(|c| c.1) == Some('=') => {
                out.push((Tok::Declare, off));
                i += 2;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(&(_, c)) = chars.get(i) else {
                        return Err(err("unterminated quoted string".into()));
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let Some(&(_, e)) = chars.get(i) else {
                                return Err(err("unterminated quoted string".into()));
                            };
                            i += 1;
                            match e {
                                'n' => s.push('\n'),
                                't' => s.push('\t'),
                                'r' => s.push('\r'),
                                '\\' => s.push('\\'),
                                '"' => s.push('"'),
                                '\'' => s.push('\''),
                                '0' => s.push('\0'),
                                'u' | 'x' => {
                                    let n = if e == 'u' { 4 } else { 2 };
                                    let hex: String =
                                        chars.iter().skip(i).take(n).map(|c| c.1).collect();
                                    let code = u32::from_str_radix(&hex, 16)
                                        .ok()
                                        .and_then(char::from_u32)
                                        .ok_or_else(|| err(format!("bad escape \\{e}{hex}")))?;
                                    s.push(code);
                                    i += n;
                                }
                                other => return Err(err(format!("unknown escape \\{other}"))),
                            }
                        }
                        '\n' => return Err(err("unterminated quoted string".into())),
                        c => s.push(c),
                    }
                }
                out.push((Tok::Str(s), off));
            }
            '`' => {
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(&(_, c)) = chars.get(i) else {
                        return Err(err("unterminated raw quoted string".into()));
                    };
                    i += 1;
                    if c == '`' {
                        break;
                    }
                    s.push(c);
                }
                out.push((Tok::Str(s), off));
            }
            '$' => {
                let mut s = String::from("$");
                i += 1;
                while let Some(&(_, c)) = chars.get(i) {
                    if !ident_char(c) {
                        break;
                    }
                    s.push(c);
                    i += 1;
                }
                out.push((Tok::Var(s), off));
            }
            '.' => {
                let next = chars.get(i + 1).map(|c| c.1);
                if next.is_some_and(|c| c.is_ascii_digit()) {
                    let start = i;
                    i += 1;
                    while chars
                        .get(i)
                        .is_some_and(|c| c.1.is_ascii_alphanumeric() || c.1 == '.')
                    {
                        i += 1;
                    }
                    let s: String = chars[start..i].iter().map(|c| c.1).collect();
                    out.push((Tok::Num(s), off));
                } else if next.is_some_and(ident_char) {
                    let mut s = String::new();
                    let joined = i > 0 && !is_space(chars[i - 1].1) && chars[i - 1].1 != '(';
                    i += 1;
                    while let Some(&(_, c)) = chars.get(i) {
                        if !ident_char(c) {
                            break;
                        }
                        s.push(c);
                        i += 1;
                    }
                    out.push((Tok::Field(s, joined), off));
                } else {
                    out.push((Tok::Dot, off));
                    i += 1;
                }
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+')
                    && chars
                        .get(i + 1)
                        .is_some_and(|n| n.1.is_ascii_digit() || n.1 == '.')) =>
            {
                let start = i;
                i += 1;
                while let Some(&(_, c)) = chars.get(i) {
                    let exp_sign = (c == '-' || c == '+')
                        && matches!(chars[i - 1].1, 'e' | 'E')
                        && !chars[start..i].iter().any(|c| c.1 == 'x' || c.1 == 'X');
                    if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exp_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                let s: String = chars[start..i].iter().map(|c| c.1).collect();
                out.push((Tok::Num(s), off));
            }
            c if ident_char(c) => {
                let mut s = String::new();
                while let Some(&(_, c)) = chars.get(i) {
                    if !ident_char(c) {
                        break;
                    }
                    s.push(c);
                    i += 1;
                }
                out.push((Tok::Ident(s), off));
            }
            '\'' => return Err(err("character constants are not supported".into())),
            other => return Err(err(format!("unexpected {other:?} in command"))),
        }
    }
    Ok(out)
}

/// Parses a number literal as Go does: integers (decimal, 0x, 0o, 0b, with `_`) are ints,
/// anything with a point or exponent is a float.
fn number(text: &str) -> Option<Arg> {
    let clean: String = text.chars().filter(|c| *c != '_').collect();
    let (neg, digits) = match clean.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, clean.strip_prefix('+').unwrap_or(&clean)),
    };
    let lower = digits.to_ascii_lowercase();
    let int = if let Some(h) = lower.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = lower.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(b) = lower.strip_prefix("0b") {
        i64::from_str_radix(b, 2).ok()
    } else if lower.len() > 1 && lower.starts_with('0') && lower.chars().all(|c| c.is_ascii_digit())
    {
        i64::from_str_radix(&lower[1..], 8).ok()
    } else {
        lower.parse::<i64>().ok()
    };
    if let Some(n) = int {
        return Some(Arg::Int(if neg { -n } else { n }));
    }
    digits
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| Arg::Float(if neg { -f } else { f }))
}

/// Parses pipelines from a token slice.
struct PipeParser<'a> {
    name: &'a str,
    line: usize,
    base: Pos,
    body: &'a str,
    toks: &'a [(Tok, usize)],
    i: usize,
    funcs: &'a dyn Fn(&str) -> bool,
    /// Parentheses open around the current position.
    depth: usize,
}

/// Deepest nesting of parentheses or of control structures a template may have.
const MAX_NESTING: usize = 100;

impl PipeParser<'_> {
    fn err(&self, m: &str) -> Error {
        Error::parse(self.name, self.line, m)
    }

    fn pos(&self, offset: usize) -> Pos {
        let before = &self.body[..offset.min(self.body.len())];
        match before.rfind('\n') {
            Some(nl) => Pos {
                line: self.base.line + before.matches('\n').count(),
                col: offset - nl,
            },
            None => Pos {
                line: self.base.line,
                col: self.base.col + offset,
            },
        }
    }

    fn offset(&self) -> usize {
        self.toks
            .get(self.i)
            .map(|t| t.1)
            .unwrap_or(self.body.len())
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|t| &t.0)
    }

    /// A pipeline up to the end of the tokens or a closing parenthesis.
    fn pipeline(&mut self, allow_decl: bool, range_decl: bool) -> Result<Pipe, Error> {
        let start = self.offset();
        let mut pipe = Pipe {
            pos: self.pos(start),
            ..Pipe::default()
        };
        if allow_decl {
            // `$x :=`, `$x =`, or in range `$i, $v :=`.
            let save = self.i;
            let mut vars = Vec::new();
            while let Some(Tok::Var(v)) = self.peek() {
                vars.push(v.clone());
                self.i += 1;
                match self.peek() {
                    Some(Tok::Comma) if range_decl && vars.len() == 1 => {
                        self.i += 1;
                    }
                    _ => break,
                }
            }
            match self.peek() {
                Some(Tok::Declare) if !vars.is_empty() => {
                    self.i += 1;
                    pipe.decl = vars;
                }
                Some(Tok::Assign) if vars.len() == 1 => {
                    self.i += 1;
                    pipe.decl = vars;
                    pipe.assign = true;
                }
                _ => self.i = save,
            }
            if pipe.decl.len() > 1 && !range_decl {
                return Err(self.err("too many declarations in command"));
            }
        }
        loop {
            match self.peek() {
                None | Some(Tok::RParen) => break,
                Some(Tok::Pipe) => {
                    if pipe.cmds.is_empty() {
                        return Err(self.err("missing command before |"));
                    }
                    self.i += 1;
                    continue;
                }
                _ => {}
            }
            let cmd = self.command()?;
            pipe.cmds.push(cmd);
            match self.peek() {
                Some(Tok::Pipe) => {
                    self.i += 1;
                    // A trailing `|` with nothing after it is accepted, as Go does.
                }
                None | Some(Tok::RParen) => break,
                _ => return Err(self.err("unexpected token in pipeline")),
            }
        }
        if pipe.cmds.is_empty() {
            return Err(self.err("missing value for command"));
        }
        pipe.src = self.body[start..self.offset()].trim().to_string();
        Ok(pipe)
    }

    /// Fields directly attached to what precedes them (`.a.b`, `$x.a`, `(...).a`).
    fn fields(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(Tok::Field(f, true)) = self.peek() {
            out.push(f.clone());
            self.i += 1;
        }
        out
    }

    fn command(&mut self) -> Result<Cmd, Error> {
        let start = self.offset();
        let mut args = Vec::new();
        while let Some((tok, _)) = self.toks.get(self.i).cloned() {
            let arg = match tok {
                Tok::Pipe | Tok::RParen => break,
                Tok::Dot => {
                    self.i += 1;
                    Arg::Dot
                }
                Tok::Field(first, _) => {
                    self.i += 1;
                    let mut chain = vec![first];
                    chain.extend(self.fields());
                    Arg::Field(chain)
                }
                Tok::Var(v) => {
                    self.i += 1;
                    Arg::Var(v, self.fields())
                }
                Tok::Str(s) => {
                    self.i += 1;
                    Arg::Str(s)
                }
                Tok::Num(n) => {
                    self.i += 1;
                    number(&n).ok_or_else(|| self.err(&format!("bad number syntax: {n:?}")))?
                }
                Tok::Ident(id) => {
                    self.i += 1;
                    match id.as_str() {
                        "true" => Arg::Bool(true),
                        "false" => Arg::Bool(false),
                        "nil" => Arg::Nil,
                        _ if (self.funcs)(&id) => Arg::Func(id),
                        _ => return Err(self.err(&format!("function {id:?} not defined"))),
                    }
                }
                Tok::LParen => {
                    self.i += 1;
                    if self.depth >= MAX_NESTING {
                        return Err(self.err("parentheses nested too deeply"));
                    }
                    self.depth += 1;
                    let inner = self.pipeline(false, false);
                    self.depth -= 1;
                    let inner = inner?;
                    if self.peek() != Some(&Tok::RParen) {
                        return Err(self.err("unclosed left paren"));
                    }
                    self.i += 1;
                    Arg::Sub(Box::new(inner), self.fields())
                }
                Tok::Comma | Tok::Declare | Tok::Assign => {
                    return Err(self.err("unexpected token in operand"))
                }
            };
            args.push(arg);
        }
        if args.is_empty() {
            return Err(self.err("empty command"));
        }
        Ok(Cmd {
            pos: self.pos(start),
            src: self.body[start..self.offset()].trim().to_string(),
            args,
        })
    }
}

/// What ended a list of nodes.
enum Stop {
    Eof,
    End,
    Else(Vec<(Tok, usize)>, String, Pos),
}

struct Parser<'a> {
    name: &'a str,
    pieces: std::vec::IntoIter<Piece>,
    defines: BTreeMap<String, Vec<Node>>,
    funcs: &'a dyn Fn(&str) -> bool,
    range_depth: usize,
    /// Control structures open around the current position.
    depth: usize,
}

impl Parser<'_> {
    fn list(&mut self) -> Result<(Vec<Node>, Stop), Error> {
        if self.depth >= MAX_NESTING {
            return Err(Error::parse(self.name, 0, "actions nested too deeply"));
        }
        self.depth += 1;
        let listed = self.list_inner();
        self.depth -= 1;
        listed
    }

    fn list_inner(&mut self) -> Result<(Vec<Node>, Stop), Error> {
        let mut nodes = Vec::new();
        while let Some(piece) = self.pieces.next() {
            let (body, pos) = match piece {
                Piece::Text(t) => {
                    nodes.push(Node::Text(t));
                    continue;
                }
                Piece::Action { body, pos } => (body, pos),
            };
            let toks = tokens(self.name, pos.line, &body)?;
            let keyword = match toks.first() {
                Some((Tok::Ident(k), _)) => k.clone(),
                _ => String::new(),
            };
            let rest: Vec<(Tok, usize)> = toks.iter().skip(1).cloned().collect();
            match keyword.as_str() {
                "end" => {
                    if !rest.is_empty() {
                        return Err(Error::parse(
                            self.name,
                            pos.line,
                            "unexpected token after end",
                        ));
                    }
                    return Ok((nodes, Stop::End));
                }
                "else" => return Ok((nodes, Stop::Else(rest, body, pos))),
                "if" | "range" | "with" => {
                    let branch = self.branch(&keyword, &rest, &body, pos)?;
                    nodes.push(match keyword.as_str() {
                        "if" => Node::If(branch),
                        "range" => Node::Range(branch),
                        _ => Node::With(branch),
                    });
                }
                "define" | "block" => {
                    let Some((Tok::Str(tname), _)) = rest.first() else {
                        return Err(Error::parse(
                            self.name,
                            pos.line,
                            &format!("{keyword} needs a template name in quotes"),
                        ));
                    };
                    let tname = tname.clone();
                    let pipe = if keyword == "block" {
                        let args: Vec<(Tok, usize)> = rest.iter().skip(1).cloned().collect();
                        if args.is_empty() {
                            return Err(Error::parse(
                                self.name,
                                pos.line,
                                "block needs a pipeline",
                            ));
                        }
                        Some(self.pipe(&args, &body, pos, false, false)?)
                    } else if rest.len() > 1 {
                        return Err(Error::parse(
                            self.name,
                            pos.line,
                            "unexpected token in define",
                        ));
                    } else {
                        None
                    };
                    let saved = self.range_depth;
                    self.range_depth = 0;
                    let (inner, end) = self.list()?;
                    self.range_depth = saved;
                    if !matches!(end, Stop::End) {
                        return Err(Error::parse(self.name, pos.line, "unexpected EOF"));
                    }
                    self.defines.insert(tname.clone(), inner);
                    if keyword == "block" {
                        nodes.push(Node::Template {
                            pos,
                            src: format!("{{{{template {tname:?}}}}}"),
                            name: tname,
                            pipe,
                        });
                    }
                }
                "template" => {
                    let Some((Tok::Str(tname), _)) = rest.first() else {
                        return Err(Error::parse(
                            self.name,
                            pos.line,
                            "template needs a template name in quotes",
                        ));
                    };
                    let args: Vec<(Tok, usize)> = rest.iter().skip(1).cloned().collect();
                    let pipe = if args.is_empty() {
                        None
                    } else {
                        Some(self.pipe(&args, &body, pos, false, false)?)
                    };
                    nodes.push(Node::Template {
                        pos,
                        src: format!("{{{{template {tname:?}}}}}"),
                        name: tname.clone(),
                        pipe,
                    });
                }
                "break" | "continue" => {
                    if self.range_depth == 0 {
                        return Err(Error::parse(
                            self.name,
                            pos.line,
                            &format!("{{{{{keyword}}}}} outside {{{{range}}}}"),
                        ));
                    }
                    nodes.push(if keyword == "break" {
                        Node::Break
                    } else {
                        Node::Continue
                    });
                }
                _ => {
                    let pipe = self.pipe(&toks, &body, pos, true, false)?;
                    nodes.push(Node::Action {
                        pos,
                        src: body.trim().to_string(),
                        pipe,
                    });
                }
            }
        }
        Ok((nodes, Stop::Eof))
    }

    fn pipe(
        &self,
        toks: &[(Tok, usize)],
        body: &str,
        pos: Pos,
        allow_decl: bool,
        range_decl: bool,
    ) -> Result<Pipe, Error> {
        // Offsets in `toks` are relative to `body`, whose first non-space byte is at `pos`.
        let lead = body.len() - body.trim_start().len();
        let base = Pos {
            line: pos.line,
            col: pos.col.saturating_sub(lead),
        };
        let mut p = PipeParser {
            name: self.name,
            line: pos.line,
            base,
            body,
            toks,
            i: 0,
            funcs: self.funcs,
            depth: 0,
        };
        let pipe = p.pipeline(allow_decl, range_decl)?;
        if p.i < toks.len() {
            return Err(Error::parse(
                self.name,
                pos.line,
                "unexpected \")\" in operand",
            ));
        }
        Ok(pipe)
    }

    fn branch(
        &mut self,
        keyword: &str,
        rest: &[(Tok, usize)],
        body: &str,
        pos: Pos,
    ) -> Result<Branch, Error> {
        if rest.is_empty() {
            return Err(Error::parse(
                self.name,
                pos.line,
                &format!("missing value for {keyword}"),
            ));
        }
        let pipe = self.pipe(rest, body, pos, true, keyword == "range")?;
        if keyword == "range" {
            self.range_depth += 1;
        }
        let listed = self.list();
        if keyword == "range" {
            self.range_depth -= 1;
        }
        let (then, end) = listed?;
        let otherwise = match end {
            Stop::Eof => return Err(Error::parse(self.name, pos.line, "unexpected EOF")),
            Stop::End => None,
            Stop::Else(else_toks, else_body, else_pos) => {
                match else_toks.first() {
                    None => {
                        let (els, end) = self.list()?;
                        if !matches!(end, Stop::End) {
                            return Err(Error::parse(self.name, pos.line, "unexpected EOF"));
                        }
                        Some(els)
                    }
                    // `else if` / `else with`: a nested branch that shares this one's `end`.
                    Some((Tok::Ident(k), _))
                        if (k == "if" || k == "with") && keyword != "range" =>
                    {
                        let k = k.clone();
                        let inner_rest: Vec<(Tok, usize)> =
                            else_toks.iter().skip(1).cloned().collect();
                        let nested = self.branch(&k, &inner_rest, &else_body, else_pos)?;
                        Some(vec![if k == "if" {
                            Node::If(nested)
                        } else {
                            Node::With(nested)
                        }])
                    }
                    _ => {
                        return Err(Error::parse(
                            self.name,
                            else_pos.line,
                            "unexpected token after else",
                        ))
                    }
                }
            }
        };
        Ok(Branch {
            pos,
            pipe,
            body: then,
            otherwise,
        })
    }
}

/// Parses `src`; `funcs` says which function names exist (Go checks them at parse time).
pub fn parse(name: &str, src: &str, funcs: &dyn Fn(&str) -> bool) -> Result<Tree, Error> {
    let pieces = split(name, src)?;
    let mut p = Parser {
        name,
        pieces: pieces.into_iter(),
        defines: BTreeMap::new(),
        funcs,
        range_depth: 0,
        depth: 0,
    };
    let (root, end) = p.list()?;
    match end {
        Stop::Eof => Ok(Tree {
            root,
            defines: p.defines,
        }),
        Stop::End => Err(Error::parse(name, 0, "unexpected {{end}}")),
        Stop::Else(_, _, pos) => Err(Error::parse(name, pos.line, "unexpected {{else}}")),
    }
}
