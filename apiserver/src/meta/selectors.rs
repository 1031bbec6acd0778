//! Label selectors (`labelSelector=`) and field selectors (`fieldSelector=`) as Kubernetes parses them.
//! Parsing yields Kubernetes-worded errors; matching works on JSON objects.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::meta::field_error::{go_quote, render_number, FieldError};
use crate::meta::names::{validate_label_value, validate_qualified_name};

/// Why a selector string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement could not be built (bad key, bad value, bad operator).
    #[error("unable to parse requirement: {0}")]
    Requirement(String),
    /// The label selector's structure is wrong (e.g. `found ',', expected: identifier after ','`).
    #[error("{0}")]
    Syntax(String),
    /// A field selector term has no recognised operator.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    InvalidFieldTerm {
        /// The whole selector string.
        selector: String,
        /// The offending comma-separated term.
        term: String,
    },
    /// A field selector value contains an unknown backslash escape.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscape(String),
    /// A field selector value contains an unescaped `,` or `=`.
    #[error("invalid field selector: unescaped character in value: {0}")]
    UnescapedCharacter(char),
    /// A field selector names a field the resource does not support.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// A label requirement operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `k=v`
    Equals,
    /// `k==v`
    DoubleEquals,
    /// `k!=v`
    NotEquals,
    /// `k in (a,b)`
    In,
    /// `k notin (a,b)`
    NotIn,
    /// `k`
    Exists,
    /// `!k`
    DoesNotExist,
    /// `k>1`
    GreaterThan,
    /// `k<1`
    LessThan,
}

/// One label requirement: key, operator and the (sorted, de-duplicated) values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, checking the key, the value count for the operator and every value.
    pub fn new(
        key: &str,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let mut values = values;
        values.sort();
        values.dedup();
        let mut errs: Vec<FieldError> = Vec::new();
        let key_errs = validate_qualified_name(key);
        if !key_errs.is_empty() {
            errs.push(FieldError::invalid("key", key, key_errs.join("; ")));
        }
        let values_json = || Value::from(values.clone());
        match operator {
            Operator::In | Operator::NotIn => {
                if values.is_empty() {
                    errs.push(FieldError::invalid(
                        "values",
                        values_json(),
                        "for 'in', 'notin' operators, values set can't be empty",
                    ));
                }
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
                if values.len() != 1 {
                    errs.push(FieldError::invalid(
                        "values",
                        values_json(),
                        "exact-match compatibility requires one single value",
                    ));
                }
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !values.is_empty() {
                    errs.push(FieldError::invalid(
                        "values",
                        values_json(),
                        "values set must be empty for exists and does not exist",
                    ));
                }
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    errs.push(FieldError::invalid(
                        "values",
                        values_json(),
                        "for 'Gt', 'Lt' operators, exactly one value is required",
                    ));
                }
                for (i, v) in values.iter().enumerate() {
                    if v.parse::<i64>().is_err() {
                        errs.push(FieldError::invalid(
                            format!("values[{i}]"),
                            v.as_str(),
                            "for 'Gt', 'Lt' operators, the value must be an integer",
                        ));
                    }
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            let msgs = validate_label_value(v);
            if !msgs.is_empty() {
                errs.push(FieldError::invalid(
                    format!("values[{i}][{v}]"),
                    v.as_str(),
                    msgs.join("; "),
                ));
            }
        }
        if !errs.is_empty() {
            return Err(SelectorError::Requirement(
                crate::meta::field_error::aggregate_message(&errs),
            ));
        }
        Ok(Requirement {
            key: key.to_string(),
            operator,
            values,
        })
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted and de-duplicated.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a label set (looked up through `get`) satisfies this requirement.
    fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        let actual = get(&self.key);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                actual.is_some_and(|a| self.values.iter().any(|v| v == a))
            }
            Operator::NotEquals | Operator::NotIn => {
                actual.is_none_or(|a| !self.values.iter().any(|v| v == a))
            }
            Operator::Exists => actual.is_some(),
            Operator::DoesNotExist => actual.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(a) = actual.and_then(|a| a.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(limit) = self.values.first().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    a > limit
                } else {
                    a < limit
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.operator {
            Operator::Equals => write!(f, "{}={}", self.key, first),
            Operator::DoubleEquals => write!(f, "{}=={}", self.key, first),
            Operator::NotEquals => write!(f, "{}!={}", self.key, first),
            Operator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::GreaterThan => write!(f, "{}>{}", self.key, first),
            Operator::LessThan => write!(f, "{}<{}", self.key, first),
        }
    }
}

/// A parsed label selector: all requirements must hold (logical AND). Empty = matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Identifier(String),
    Equals,
    DoubleEquals,
    NotEquals,
    Not,
    Greater,
    Less,
    OpenParen,
    CloseParen,
    Comma,
    End,
}

impl Token {
    /// The literal text used in error messages.
    fn literal(&self) -> &str {
        match self {
            Token::Identifier(s) => s,
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Not => "!",
            Token::Greater => ">",
            Token::Less => "<",
            Token::OpenParen => "(",
            Token::CloseParen => ")",
            Token::Comma => ",",
            Token::End => "",
        }
    }

    fn is_identifier(&self) -> bool {
        matches!(self, Token::Identifier(_))
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn tokenize(input: &str) -> Vec<Token> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        if is_blank(c) {
            i += 1;
            continue;
        }
        if is_special(c) {
            let next = chars.get(i + 1).copied();
            let (tok, width) = match (c, next) {
                ('=', Some('=')) => (Token::DoubleEquals, 2),
                ('!', Some('=')) => (Token::NotEquals, 2),
                ('=', _) => (Token::Equals, 1),
                ('!', _) => (Token::Not, 1),
                ('>', _) => (Token::Greater, 1),
                ('<', _) => (Token::Less, 1),
                ('(', _) => (Token::OpenParen, 1),
                (')', _) => (Token::CloseParen, 1),
                _ => (Token::Comma, 1),
            };
            tokens.push(tok);
            i += width;
            continue;
        }
        let start = i;
        while let Some(&c) = chars.get(i) {
            if is_blank(c) || is_special(c) {
                break;
            }
            i += 1;
        }
        tokens.push(Token::Identifier(
            chars.get(start..i).unwrap_or_default().iter().collect(),
        ));
    }
    tokens.push(Token::End);
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            match self.peek() {
                Token::Identifier(_) | Token::Not => {
                    let r = self.parse_requirement().map_err(|e| match e {
                        SelectorError::Requirement(m) | SelectorError::Syntax(m) => {
                            SelectorError::Requirement(m)
                        }
                        other => other,
                    })?;
                    reqs.push(r);
                    let t = self.next();
                    match t {
                        Token::End => return Ok(reqs),
                        Token::Comma => {
                            let la = self.peek();
                            if !la.is_identifier() && *la != Token::Not {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{}', expected: identifier after ','",
                                    la.literal()
                                )));
                            }
                        }
                        other => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                other.literal()
                            )))
                        }
                    }
                }
                Token::End => return Ok(reqs),
                other => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.literal()
                    )))
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut negated = false;
        let mut tok = self.next();
        if tok == Token::Not {
            negated = true;
            tok = self.next();
        }
        let key = match tok {
            Token::Identifier(k) => k,
            other => {
                return Err(SelectorError::Syntax(format!(
                    "found '{}', expected: identifier",
                    other.literal()
                )))
            }
        };
        let key_errs = validate_qualified_name(&key);
        if !key_errs.is_empty() {
            return Err(SelectorError::Requirement(format!(
                "<nil>: Invalid value: {}: {}",
                go_quote(&key),
                key_errs.join("; ")
            )));
        }
        if negated {
            return Requirement::new(&key, Operator::DoesNotExist, Vec::new());
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Requirement::new(&key, Operator::Exists, Vec::new());
        }
        let op_tok = self.next();
        let operator = match &op_tok {
            Token::Identifier(s) if s == "in" => Operator::In,
            Token::Identifier(s) if s == "notin" => Operator::NotIn,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::NotEquals => Operator::NotEquals,
            Token::Greater => Operator::GreaterThan,
            Token::Less => Operator::LessThan,
            other => {
                return Err(SelectorError::Syntax(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                )))
            }
        };
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_value_set()?,
            _ => self.parse_exact_value()?,
        };
        Requirement::new(&key, operator, values)
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.next() {
            Token::Identifier(v) => Ok(vec![v]),
            other => Err(SelectorError::Syntax(format!(
                "found '{}', expected: identifier",
                other.literal()
            ))),
        }
    }

    fn parse_value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        let open = self.next();
        if open != Token::OpenParen {
            return Err(SelectorError::Syntax(format!(
                "found '{}' expected: '('",
                open.literal()
            )));
        }
        match self.peek().clone() {
            Token::CloseParen => {
                self.next();
                Ok(vec![String::new()])
            }
            Token::Identifier(_) | Token::Comma => {
                let values = self.parse_identifier_list()?;
                let close = self.next();
                if close != Token::CloseParen {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: ')'",
                        close.literal()
                    )));
                }
                Ok(values)
            }
            other => Err(SelectorError::Syntax(format!(
                "found '{}', expected: ',', ')' or identifier",
                other.literal()
            ))),
        }
    }

    /// Reads `a, b, , c` up to (not including) the closing parenthesis; empty slots mean "".
    fn parse_identifier_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut values: Vec<String> = Vec::new();
        loop {
            match self.next() {
                Token::Identifier(v) => {
                    values.push(v);
                    match self.peek() {
                        Token::Comma => {
                            self.next();
                            if *self.peek() == Token::CloseParen {
                                values.push(String::new());
                                return Ok(values);
                            }
                        }
                        Token::CloseParen => return Ok(values),
                        other => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',' or ')'",
                                other.literal()
                            )))
                        }
                    }
                }
                Token::Comma => {
                    // a leading or doubled comma stands for an empty value
                    values.push(String::new());
                    if *self.peek() == Token::CloseParen {
                        return Ok(values);
                    }
                }
                other => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: ',', or identifier",
                        other.literal()
                    )))
                }
            }
        }
    }
}

impl LabelSelector {
    /// Parses a selector such as `app=web,tier in (a,b),!legacy`. The empty string selects everything.
    pub fn parse(selector: &str) -> Result<LabelSelector, SelectorError> {
        let mut parser = Parser {
            tokens: tokenize(selector),
            pos: 0,
        };
        let mut requirements = parser.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// A selector that matches every object.
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    /// Builds a selector from already-validated requirements.
    pub fn from_requirements(requirements: Vec<Requirement>) -> LabelSelector {
        LabelSelector { requirements }
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Matches an object's `metadata.labels` value (`None`, `null` or non-object = no labels;
    /// non-string label values are ignored).
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        match labels {
            Some(Value::Object(m)) => self.matches_map(m),
            _ => self.matches_with(|_| None),
        }
    }

    /// Matches a JSON label map.
    pub fn matches_map(&self, labels: &Map<String, Value>) -> bool {
        self.matches_with(|k| labels.get(k).and_then(Value::as_str))
    }

    /// Matches a plain string label map.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// Matches a whole object by its `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.get("metadata").and_then(|m| m.get("labels")))
    }

    fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str> + Copy) -> bool {
        self.requirements.iter().all(|r| r.matches_with(get))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

/// A field selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `path=value`
    Equals,
    /// `path==value`
    DoubleEquals,
    /// `path!=value`
    NotEquals,
}

/// One field selector term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The dotted field label, e.g. `metadata.name`.
    pub field: String,
    /// The comparison.
    pub operator: FieldOperator,
    /// The unescaped value.
    pub value: String,
}

impl FieldRequirement {
    fn matches_value(&self, actual: &str) -> bool {
        match self.operator {
            FieldOperator::Equals | FieldOperator::DoubleEquals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::DoubleEquals => "==",
            FieldOperator::NotEquals => "!=",
        };
        write!(f, "{}{}{}", self.field, op, escape_field_value(&self.value))
    }
}

/// A parsed field selector: all terms must hold. Empty = matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

/// Escapes `\`, `,` and `=` in a field selector value.
pub fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Splits on commas that are not backslash-escaped; escapes are kept for later unescaping.
fn split_field_terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in selector.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(selector.get(start..i).unwrap_or_default());
            start = i + 1;
        }
    }
    terms.push(selector.get(start..).unwrap_or_default());
    terms
}

/// Splits a term at the first operator (`!=`, `==`, `=`); the field part has no escaping.
fn split_field_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = term.get(i..).unwrap_or_default();
        let lhs = term.get(..i).unwrap_or_default();
        if let Some(r) = rest.strip_prefix("!=") {
            return Some((lhs, FieldOperator::NotEquals, r));
        }
        if let Some(r) = rest.strip_prefix("==") {
            return Some((lhs, FieldOperator::DoubleEquals, r));
        }
        if let Some(r) = rest.strip_prefix('=') {
            return Some((lhs, FieldOperator::Equals, r));
        }
    }
    None
}

/// Undoes `\\`, `\,` and `\=`; any other escape or a bare `,`/`=` is an error.
fn unescape_field_value(value: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(value.len());
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            if matches!(c, '\\' | ',' | '=') {
                out.push(c);
            } else {
                return Err(SelectorError::InvalidEscape(format!("\\{c}")));
            }
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            ',' | '=' => return Err(SelectorError::UnescapedCharacter(c)),
            _ => out.push(c),
        }
    }
    if escaped {
        return Err(SelectorError::InvalidEscape("\\".to_string()));
    }
    Ok(out)
}

/// Reads a dotted field path from an object as a string: strings as-is, numbers and booleans
/// formatted, anything else (missing, null, objects, arrays) as "".
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => render_number(n),
        _ => String::new(),
    }
}

impl FieldSelector {
    /// Parses `metadata.name=foo,status.phase!=Active`. The empty string selects everything.
    pub fn parse(selector: &str) -> Result<FieldSelector, SelectorError> {
        let mut terms = split_field_terms(selector);
        terms.sort_unstable();
        let mut requirements = Vec::new();
        for term in terms {
            if term.is_empty() {
                continue;
            }
            let Some((field, operator, raw)) = split_field_term(term) else {
                return Err(SelectorError::InvalidFieldTerm {
                    selector: selector.to_string(),
                    term: term.to_string(),
                });
            };
            let value = unescape_field_value(raw)?;
            requirements.push(FieldRequirement {
                field: field.to_string(),
                operator,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// A selector that matches every object.
    pub fn everything() -> FieldSelector {
        FieldSelector::default()
    }

    /// Whether the selector has no terms.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms (sorted by their text).
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Rejects fields outside `allowed` with `field label not supported: <label>`.
    pub fn validate_fields(&self, allowed: &[&str]) -> Result<(), SelectorError> {
        match self
            .requirements
            .iter()
            .find(|r| !allowed.contains(&r.field.as_str()))
        {
            Some(r) => Err(SelectorError::UnsupportedField(r.field.clone())),
            None => Ok(()),
        }
    }

    /// Whether the object satisfies every term (missing fields read as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(&field_value(obj, &r.field)))
    }

    /// Whether a precomputed field set satisfies every term (missing fields read as "").
    pub fn matches_fields(&self, fields: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(fields.get(&r.field).map(String::as_str).unwrap_or("")))
    }

    /// The exact value required for `field` by an `=`/`==` term, if any.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator != FieldOperator::NotEquals)
            .map(|r| r.value.as_str())
    }

    /// The object name asked for by a `metadata.name=<name>` term (a single-object list/watch).
    pub fn requested_name(&self) -> Option<&str> {
        self.requires_exact_match("metadata.name")
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests;
