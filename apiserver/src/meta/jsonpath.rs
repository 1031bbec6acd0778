//! The Kubernetes JSONPath subset used by CRD printer columns and selectable fields, on `serde_json`.
//! Supports fields, quoted keys, indexes, slices, wildcards, recursive descent and `[?(@.x == "v")]` filters.

use std::fmt;

use serde_json::Value;

/// A parsed JSONPath expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    source: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    /// `.name` or `['name']`
    Field(String),
    /// `['a','b']`
    Fields(Vec<String>),
    /// `.*` or `[*]`: every value of a map or element of a list
    Wildcard,
    /// `..name`: `name` at any depth
    Recursive(String),
    /// `..*`: every descendant
    RecursiveWildcard,
    /// `[n]`, negative counts from the end
    Index(i64),
    /// `[0,2]`
    Indexes(Vec<i64>),
    /// `[start:end:step]`
    Slice(Option<i64>, Option<i64>, i64),
    /// `[?(...)]`
    Filter(Box<Filter>),
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    left: Operand,
    comparison: Option<(CmpOp, Operand)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    /// `@.a.b` (relative to the element under test)
    Current(Vec<Segment>),
    /// `$.a.b` (relative to the document root)
    Root(Vec<Segment>),
    Literal(Value),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Parses an expression such as `.status.conditions[?(@.type=="Ready")].status`.
/// Surrounding `{` `}` and a leading `$` are optional.
pub fn parse(expr: &str) -> Result<Path, String> {
    let trimmed = expr.trim();
    let inner = if let Some(rest) = trimmed.strip_prefix('{') {
        match rest.strip_suffix('}') {
            Some(inner) => inner.trim(),
            None => return Err(format!("unclosed action in {expr:?}")),
        }
    } else if trimmed.ends_with('}') {
        return Err(format!("unexpected '}}' in {expr:?}"));
    } else {
        trimmed
    };
    let body = inner.strip_prefix('$').unwrap_or(inner);
    let chars: Vec<char> = body.chars().collect();
    let mut pos = 0;
    let segments = parse_segments(&chars, &mut pos, true)?;
    if pos < chars.len() {
        return Err(format!(
            "unexpected {:?} at position {pos} in {expr:?}",
            chars.get(pos).copied().unwrap_or(' ')
        ));
    }
    Ok(Path {
        source: expr.to_string(),
        segments,
    })
}

fn is_field_terminator(c: char) -> bool {
    matches!(
        c,
        '.' | '['
            | ']'
            | ','
            | '$'
            | '@'
            | '{'
            | '}'
            | '('
            | ')'
            | '='
            | '!'
            | '<'
            | '>'
            | '"'
            | '\''
    ) || c.is_whitespace()
}

/// Reads a bare field name; a backslash makes the next character literal (`app\.kubernetes\.io`).
fn read_name(chars: &[char], pos: &mut usize) -> String {
    let mut name = String::new();
    while let Some(&c) = chars.get(*pos) {
        if c == '\\' {
            if let Some(&next) = chars.get(*pos + 1) {
                name.push(next);
                *pos += 2;
                continue;
            }
            *pos += 1;
            continue;
        }
        if is_field_terminator(c) {
            break;
        }
        name.push(c);
        *pos += 1;
    }
    name
}

/// Parses segments until the input ends or a character that cannot start a segment.
/// `allow_bare` accepts a leading field without a dot (`metadata.name`).
fn parse_segments(
    chars: &[char],
    pos: &mut usize,
    allow_bare: bool,
) -> Result<Vec<Segment>, String> {
    let mut segs = Vec::new();
    let mut first = true;
    while let Some(&c) = chars.get(*pos) {
        match c {
            '.' => {
                *pos += 1;
                if chars.get(*pos) == Some(&'.') {
                    *pos += 1;
                    if chars.get(*pos) == Some(&'*') {
                        *pos += 1;
                        segs.push(Segment::RecursiveWildcard);
                    } else {
                        let name = read_name(chars, pos);
                        if name.is_empty() {
                            return Err(format!("missing field name after '..' at position {pos}"));
                        }
                        segs.push(Segment::Recursive(name));
                    }
                } else if chars.get(*pos) == Some(&'*') {
                    *pos += 1;
                    segs.push(Segment::Wildcard);
                } else {
                    let name = read_name(chars, pos);
                    // `.` alone (or before `[`) refers to the current value
                    if !name.is_empty() {
                        segs.push(Segment::Field(name));
                    }
                }
            }
            '[' => {
                *pos += 1;
                segs.push(parse_bracket(chars, pos)?);
            }
            c if first && allow_bare && !is_field_terminator(c) => {
                let name = read_name(chars, pos);
                segs.push(Segment::Field(name));
            }
            _ => break,
        }
        first = false;
    }
    Ok(segs)
}

/// Parses the inside of `[...]` (the opening bracket already consumed) including the `]`.
fn parse_bracket(chars: &[char], pos: &mut usize) -> Result<Segment, String> {
    skip_ws(chars, pos);
    match chars.get(*pos) {
        Some('?') => {
            *pos += 1;
            skip_ws(chars, pos);
            if chars.get(*pos) != Some(&'(') {
                return Err("expected '(' after '?' in filter".to_string());
            }
            *pos += 1;
            let filter = parse_filter(chars, pos)?;
            skip_ws(chars, pos);
            if chars.get(*pos) != Some(&')') {
                return Err("unclosed filter, expected ')'".to_string());
            }
            *pos += 1;
            expect_close(chars, pos)?;
            Ok(Segment::Filter(Box::new(filter)))
        }
        Some('*') => {
            *pos += 1;
            expect_close(chars, pos)?;
            Ok(Segment::Wildcard)
        }
        Some('\'') | Some('"') => {
            let mut names = Vec::new();
            loop {
                skip_ws(chars, pos);
                names.push(read_quoted(chars, pos)?);
                skip_ws(chars, pos);
                match chars.get(*pos) {
                    Some(',') => *pos += 1,
                    Some(']') => {
                        *pos += 1;
                        break;
                    }
                    _ => return Err("expected ',' or ']' after quoted key".to_string()),
                }
            }
            if names.len() == 1 {
                Ok(Segment::Field(names.swap_remove(0)))
            } else {
                Ok(Segment::Fields(names))
            }
        }
        _ => {
            let start = *pos;
            while let Some(&c) = chars.get(*pos) {
                if c == ']' {
                    break;
                }
                *pos += 1;
            }
            if chars.get(*pos) != Some(&']') {
                return Err("unclosed '['".to_string());
            }
            let text: String = chars.get(start..*pos).unwrap_or_default().iter().collect();
            *pos += 1;
            parse_index_expr(text.trim())
        }
    }
}

fn parse_index_expr(text: &str) -> Result<Segment, String> {
    let int = |s: &str| -> Result<Option<i64>, String> {
        let s = s.trim();
        if s.is_empty() {
            Ok(None)
        } else {
            s.parse::<i64>()
                .map(Some)
                .map_err(|_| format!("invalid array index {s:?}"))
        }
    };
    if text.contains(':') {
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() > 3 {
            return Err(format!("invalid slice {text:?}"));
        }
        let start = int(parts.first().copied().unwrap_or(""))?;
        let end = int(parts.get(1).copied().unwrap_or(""))?;
        let step = int(parts.get(2).copied().unwrap_or(""))?.unwrap_or(1);
        if step <= 0 {
            return Err(format!("invalid slice step in {text:?}"));
        }
        return Ok(Segment::Slice(start, end, step));
    }
    if text.contains(',') {
        let mut idx = Vec::new();
        for p in text.split(',') {
            match int(p)? {
                Some(i) => idx.push(i),
                None => return Err(format!("invalid array index list {text:?}")),
            }
        }
        return Ok(Segment::Indexes(idx));
    }
    match int(text)? {
        Some(i) => Ok(Segment::Index(i)),
        None => Err("empty brackets".to_string()),
    }
}

fn skip_ws(chars: &[char], pos: &mut usize) {
    while chars.get(*pos).is_some_and(|c| c.is_whitespace()) {
        *pos += 1;
    }
}

fn expect_close(chars: &[char], pos: &mut usize) -> Result<(), String> {
    skip_ws(chars, pos);
    if chars.get(*pos) == Some(&']') {
        *pos += 1;
        Ok(())
    } else {
        Err("expected ']'".to_string())
    }
}

/// Reads a `'...'` or `"..."` string with backslash escapes.
fn read_quoted(chars: &[char], pos: &mut usize) -> Result<String, String> {
    let Some(&quote) = chars.get(*pos) else {
        return Err("expected a quoted string".to_string());
    };
    if quote != '\'' && quote != '"' {
        return Err("expected a quoted string".to_string());
    }
    *pos += 1;
    let mut out = String::new();
    loop {
        match chars.get(*pos) {
            None => return Err("unterminated quoted string".to_string()),
            Some('\\') => {
                let Some(&n) = chars.get(*pos + 1) else {
                    return Err("unterminated quoted string".to_string());
                };
                out.push(match n {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    other => other,
                });
                *pos += 2;
            }
            Some(&c) if c == quote => {
                *pos += 1;
                return Ok(out);
            }
            Some(&c) => {
                out.push(c);
                *pos += 1;
            }
        }
    }
}

fn parse_filter(chars: &[char], pos: &mut usize) -> Result<Filter, String> {
    skip_ws(chars, pos);
    let left = parse_operand(chars, pos)?;
    skip_ws(chars, pos);
    let op = match (chars.get(*pos), chars.get(*pos + 1)) {
        (Some('='), Some('=')) => Some((CmpOp::Eq, 2)),
        (Some('!'), Some('=')) => Some((CmpOp::Ne, 2)),
        (Some('<'), Some('=')) => Some((CmpOp::Le, 2)),
        (Some('>'), Some('=')) => Some((CmpOp::Ge, 2)),
        (Some('<'), _) => Some((CmpOp::Lt, 1)),
        (Some('>'), _) => Some((CmpOp::Gt, 1)),
        (Some(')'), _) => None,
        (Some(c), _) => return Err(format!("unrecognized filter operator at {c:?}")),
        (None, _) => return Err("unclosed filter".to_string()),
    };
    let comparison = match op {
        None => None,
        Some((op, width)) => {
            *pos += width;
            skip_ws(chars, pos);
            Some((op, parse_operand(chars, pos)?))
        }
    };
    if comparison.is_none() && matches!(left, Operand::Literal(_)) {
        return Err("a filter without an operator must test a path".to_string());
    }
    Ok(Filter { left, comparison })
}

fn parse_operand(chars: &[char], pos: &mut usize) -> Result<Operand, String> {
    match chars.get(*pos) {
        Some('@') => {
            *pos += 1;
            Ok(Operand::Current(parse_segments(chars, pos, false)?))
        }
        Some('$') => {
            *pos += 1;
            Ok(Operand::Root(parse_segments(chars, pos, false)?))
        }
        Some('\'') | Some('"') => Ok(Operand::Literal(Value::String(read_quoted(chars, pos)?))),
        Some(_) => {
            let start = *pos;
            while chars
                .get(*pos)
                .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.' | '_'))
            {
                *pos += 1;
            }
            let word: String = chars.get(start..*pos).unwrap_or_default().iter().collect();
            match word.as_str() {
                "" => Err("expected a filter operand".to_string()),
                "true" => Ok(Operand::Literal(Value::Bool(true))),
                "false" => Ok(Operand::Literal(Value::Bool(false))),
                "null" | "nil" => Ok(Operand::Literal(Value::Null)),
                w => {
                    if let Ok(i) = w.parse::<i64>() {
                        Ok(Operand::Literal(Value::from(i)))
                    } else if let Some(n) =
                        w.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
                    {
                        Ok(Operand::Literal(Value::Number(n)))
                    } else {
                        Err(format!("unrecognized filter operand {w:?}"))
                    }
                }
            }
        }
        None => Err("expected a filter operand".to_string()),
    }
}

/// Evaluates a path against a document, returning every match in document order.
/// Missing keys and out-of-range indexes simply produce no results.
pub fn evaluate<'a>(path: &Path, root: &'a Value) -> Vec<&'a Value> {
    eval_segments(&path.segments, root, root)
}

/// The first match of [`evaluate`], if any.
pub fn evaluate_first<'a>(path: &Path, root: &'a Value) -> Option<&'a Value> {
    evaluate(path, root).into_iter().next()
}

fn eval_segments<'a>(segs: &[Segment], start: &'a Value, root: &'a Value) -> Vec<&'a Value> {
    let mut current: Vec<&'a Value> = vec![start];
    for seg in segs {
        let mut next: Vec<&'a Value> = Vec::new();
        for v in current {
            apply_segment(seg, v, root, &mut next);
        }
        current = next;
        if current.is_empty() {
            break;
        }
    }
    current
}

/// Resolves a possibly negative index against a length.
fn resolve_index(i: i64, len: usize) -> Option<usize> {
    let len_i = i64::try_from(len).ok()?;
    let idx = if i < 0 { len_i.checked_add(i)? } else { i };
    if idx < 0 || idx >= len_i {
        None
    } else {
        usize::try_from(idx).ok()
    }
}

fn apply_segment<'a>(seg: &Segment, v: &'a Value, root: &'a Value, out: &mut Vec<&'a Value>) {
    match seg {
        Segment::Field(name) => {
            if let Some(x) = v.as_object().and_then(|m| m.get(name)) {
                out.push(x);
            }
        }
        Segment::Fields(names) => {
            if let Some(m) = v.as_object() {
                out.extend(names.iter().filter_map(|n| m.get(n)));
            }
        }
        Segment::Wildcard => match v {
            Value::Object(m) => out.extend(m.values()),
            Value::Array(a) => out.extend(a.iter()),
            _ => {}
        },
        Segment::Index(i) => {
            if let Some(a) = v.as_array() {
                if let Some(x) = resolve_index(*i, a.len()).and_then(|i| a.get(i)) {
                    out.push(x);
                }
            }
        }
        Segment::Indexes(list) => {
            if let Some(a) = v.as_array() {
                for i in list {
                    if let Some(x) = resolve_index(*i, a.len()).and_then(|i| a.get(i)) {
                        out.push(x);
                    }
                }
            }
        }
        Segment::Slice(start, end, step) => {
            if let Some(a) = v.as_array() {
                let len = i64::try_from(a.len()).unwrap_or(i64::MAX);
                let clamp = |x: i64| -> i64 {
                    let x = if x < 0 { len.saturating_add(x) } else { x };
                    x.clamp(0, len)
                };
                let s = start.map(clamp).unwrap_or(0);
                let e = end.map(clamp).unwrap_or(len);
                let step = (*step).max(1);
                let mut i = s;
                while i < e {
                    if let Some(x) = usize::try_from(i).ok().and_then(|i| a.get(i)) {
                        out.push(x);
                    }
                    i = i.saturating_add(step);
                }
            }
        }
        Segment::Recursive(name) => {
            for d in descendants(v) {
                if let Some(x) = d.as_object().and_then(|m| m.get(name)) {
                    out.push(x);
                }
            }
        }
        Segment::RecursiveWildcard => {
            out.extend(descendants(v).into_iter().skip(1));
        }
        Segment::Filter(filter) => {
            let items: Vec<&'a Value> = match v {
                Value::Array(a) => a.iter().collect(),
                Value::Object(m) => m.values().collect(),
                _ => Vec::new(),
            };
            for item in items {
                if filter_matches(filter, item, root) {
                    out.push(item);
                }
            }
        }
    }
}

/// The value itself and all values nested in it, pre-order, without recursion.
fn descendants(v: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        out.push(x);
        match x {
            Value::Object(m) => stack.extend(m.values().rev()),
            Value::Array(a) => stack.extend(a.iter().rev()),
            _ => {}
        }
    }
    out
}

fn operand_values<'a>(op: &'a Operand, item: &'a Value, root: &'a Value) -> Vec<&'a Value> {
    match op {
        Operand::Current(segs) => eval_segments(segs, item, root),
        Operand::Root(segs) => eval_segments(segs, root, root),
        Operand::Literal(v) => vec![v],
    }
}

fn filter_matches(filter: &Filter, item: &Value, root: &Value) -> bool {
    let lefts = operand_values(&filter.left, item, root);
    let Some(left) = lefts.first() else {
        return false;
    };
    match &filter.comparison {
        None => !matches!(left, Value::Null | Value::Bool(false)),
        Some((op, right)) => {
            let rights = operand_values(right, item, root);
            match rights.first() {
                Some(r) => compare(left, *op, r),
                None => false,
            }
        }
    }
}

/// Compares two scalars; values of different kinds never match.
fn compare(l: &Value, op: CmpOp, r: &Value) -> bool {
    use std::cmp::Ordering;
    let ord: Option<Ordering> = match (l, r) {
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => a
                .as_f64()
                .zip(b.as_f64())
                .and_then(|(x, y)| x.partial_cmp(&y)),
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => match op {
            CmpOp::Eq | CmpOp::Ne => Some(a.cmp(b)),
            _ => None,
        },
        (Value::Null, Value::Null) => match op {
            CmpOp::Eq | CmpOp::Ne => Some(Ordering::Equal),
            _ => None,
        },
        _ => None,
    };
    let Some(ord) = ord else {
        return false;
    };
    match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Le => ord != Ordering::Greater,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Ge => ord != Ordering::Less,
    }
}

impl Path {
    /// A path of plain fields (`.a.b.c`), built without parsing.
    pub fn from_fields(fields: &[&str]) -> Path {
        let mut source = String::new();
        for f in fields {
            source.push('.');
            for c in f.chars() {
                if is_field_terminator(c) || c == '\\' {
                    source.push('\\');
                }
                source.push(c);
            }
        }
        Path {
            source,
            segments: fields
                .iter()
                .map(|f| Segment::Field((*f).to_string()))
                .collect(),
        }
    }

    /// The expression text this path was parsed from.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the path has no segments (it selects the document itself).
    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }

    /// Evaluates this path; see [`evaluate`].
    pub fn evaluate<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        evaluate(self, root)
    }

    /// The plain field names when the path is only `.a.b.c` fields (useful for field selectors).
    pub fn simple_fields(&self) -> Option<Vec<&str>> {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Field(f) => Some(f.as_str()),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Path {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

#[cfg(test)]
mod tests;
