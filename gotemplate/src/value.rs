//! The values templates compute with, and how Go's `fmt` prints them.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value as Json;

/// A template value. `Missing` is Go's "no value" (a key that is not in its map); `Nil` is a
/// present `null`.
#[derive(Clone, Debug)]
pub enum V {
    Missing,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    List(Rc<Vec<V>>),
    Map(Rc<BTreeMap<String, V>>),
}

/// How numbers of the data are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbers {
    /// As Go code that decoded JSON or YAML into `interface{}` sees them: every number is a
    /// float64 (`123456789` prints as `1.23456789e+08`, `eq .n 1` is a type error).
    GoFloat,
    /// Integers stay integers (the project's choice: `replicas: 1000000` prints as written).
    Exact,
}

impl V {
    pub fn from_json(v: &Json, numbers: Numbers) -> V {
        match v {
            Json::Null => V::Nil,
            Json::Bool(b) => V::Bool(*b),
            Json::Number(n) => match (numbers, n.as_i64()) {
                (Numbers::Exact, Some(i)) => V::Int(i),
                _ => V::Float(n.as_f64().unwrap_or(0.0)),
            },
            Json::String(s) => V::Str(Rc::from(s.as_str())),
            Json::Array(a) => V::List(Rc::new(
                a.iter().map(|x| V::from_json(x, numbers)).collect(),
            )),
            Json::Object(m) => V::Map(Rc::new(
                m.iter()
                    .map(|(k, x)| (k.clone(), V::from_json(x, numbers)))
                    .collect(),
            )),
        }
    }

    pub fn to_json(&self) -> Json {
        match self {
            V::Missing | V::Nil => Json::Null,
            V::Bool(b) => Json::Bool(*b),
            V::Int(i) => Json::from(*i),
            V::Float(f) => serde_json::Number::from_f64(*f)
                .map(Json::Number)
                .unwrap_or(Json::Null),
            V::Str(s) => Json::String(s.to_string()),
            V::List(l) => Json::Array(l.iter().map(V::to_json).collect()),
            V::Map(m) => Json::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }

    pub fn str(s: impl Into<String>) -> V {
        V::Str(Rc::from(s.into().as_str()))
    }

    /// Go's `truth`: false for no value, nil, false, 0, and empty strings, lists and maps.
    pub fn truth(&self) -> bool {
        match self {
            V::Missing | V::Nil => false,
            V::Bool(b) => *b,
            V::Int(i) => *i != 0,
            V::Float(f) => *f != 0.0,
            V::Str(s) => !s.is_empty(),
            V::List(l) => !l.is_empty(),
            V::Map(m) => !m.is_empty(),
        }
    }

    /// Go's name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            V::Missing | V::Nil => "<nil>",
            V::Bool(_) => "bool",
            V::Int(_) => "int",
            V::Float(_) => "float64",
            V::Str(_) => "string",
            V::List(_) => "[]interface {}",
            V::Map(_) => "map[string]interface {}",
        }
    }
}

/// Go's `%v` of a float64: `%g` with the shortest representation, which switches to exponent
/// form when the decimal exponent is below -4 or at least 6 (`1e+06`, `1.23456789e+08`).
pub fn format_float(f: f64) -> String {
    format_float_g(f, None)
}

/// `%g` with an optional precision, as Go's strconv formats it.
pub fn format_float_g(f: f64, precision: Option<usize>) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    // Digits and decimal exponent: shortest round-trip, or rounded to `precision` digits.
    let sci = match precision {
        None => format!("{f:e}"),
        Some(p) => format!("{:.*e}", p.max(1) - 1, f),
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let mut digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if precision.is_some() {
        // %g drops trailing zeros.
        while digits.len() > 1 && digits.ends_with('0') {
            digits.pop();
        }
    }
    let eprec = match precision {
        None => 6,
        Some(p) => {
            let p = p.max(1) as i32;
            if p > digits.len() as i32 && digits.len() as i32 > exp {
                digits.len() as i32
            } else {
                p
            }
        }
    };
    let sign = if negative { "-" } else { "" };
    if exp < -4 || exp >= eprec {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    // Plain decimal form.
    let point = exp + 1;
    let s = if point <= 0 {
        format!("0.{}{}", "0".repeat((-point) as usize), digits)
    } else if point as usize >= digits.len() {
        format!("{}{}", digits, "0".repeat(point as usize - digits.len()))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{s}")
}

/// Go's `fmt` `%v` of a value (nil reads `<nil>`; an action prints a lone nil as `<no value>`).
pub fn format_v(v: &V, out: &mut String) {
    match v {
        V::Missing | V::Nil => out.push_str("<nil>"),
        V::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        V::Int(i) => out.push_str(&i.to_string()),
        V::Float(f) => out.push_str(&format_float(*f)),
        V::Str(s) => out.push_str(s),
        V::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                format_v(x, out);
            }
            out.push(']');
        }
        V::Map(m) => {
            out.push_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                format_v(x, out);
            }
            out.push(']');
        }
    }
}

pub fn to_v_string(v: &V) -> String {
    let mut s = String::new();
    format_v(v, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        for (f, want) in [
            (8443.0, "8443"),
            (1.5, "1.5"),
            (123456789.0, "1.23456789e+08"),
            (1000000.0, "1e+06"),
            (100000.0, "100000"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (0.0, "0"),
        ] {
            assert_eq!(format_float(f), want, "{f}");
        }
        assert_eq!(format_float_g(5.4321, Some(3)), "5.43");
        assert_eq!(format_float_g(1234567.0, Some(3)), "1.23e+06");
    }
}
