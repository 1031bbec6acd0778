//! The template functions: Go's builtins (`len`, `index`, `slice`, `print`, `printf`,
//! `println`, `html`, `js`, `urlquery`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`; `and`, `or` and `not`
//! are evaluated lazily in exec.rs) and the ones the gotemplates use with Helm's meaning
//! (`default`, `indent`, `nindent`, `toYaml`, `toJson`).

use std::rc::Rc;

use super::value::{format_float_g, format_v, to_v_string, V};

/// Every function name a template may call.
pub const NAMES: &[&str] = &[
    "and", "or", "not", "len", "index", "slice", "print", "printf", "println", "html", "js",
    "urlquery", "eq", "ne", "lt", "le", "gt", "ge", "default", "indent", "nindent", "toYaml",
    "toJson",
];

pub fn exists(name: &str) -> bool {
    NAMES.contains(&name)
}

/// Calls an eagerly evaluated function. With `mixed_numbers`, integers and floats compare by value
/// (the project's mode, where data integers stay integers); otherwise they are Go's distinct kinds.
pub fn call(name: &str, args: &[V], mixed_numbers: bool) -> Result<V, String> {
    match name {
        "len" => {
            one(name, args)?;
            match &args[0] {
                V::Str(s) => Ok(V::Int(s.len() as i64)),
                V::List(l) => Ok(V::Int(l.len() as i64)),
                V::Map(m) => Ok(V::Int(m.len() as i64)),
                other => Err(format!(
                    "error calling len: len of type {}",
                    other.type_name()
                )),
            }
        }
        "index" => index(args),
        "slice" => slice(args),
        "print" => Ok(V::str(sprint(args))),
        "println" => Ok(V::str(sprintln(args))),
        "printf" => {
            let Some(V::Str(format)) = args.first() else {
                return Err(match args.first() {
                    None => "wrong number of args for printf: want at least 1 got 0".into(),
                    Some(v) => format!(
                        "wrong type for value; expected string; got {}",
                        v.type_name()
                    ),
                });
            };
            Ok(V::str(sprintf(format, &args[1..])))
        }
        "html" => Ok(V::str(html_escape(&sprint(args)))),
        "js" => Ok(V::str(js_escape(&sprint(args)))),
        "urlquery" => Ok(V::str(query_escape(&sprint(args)))),
        "eq" => {
            if args.len() < 2 {
                return Err(format!(
                    "wrong number of args for eq: want at least 1 got {}",
                    args.len()
                ));
            }
            for other in &args[1..] {
                if equal(&args[0], other, mixed_numbers)
                    .map_err(|e| format!("error calling eq: {e}"))?
                {
                    return Ok(V::Bool(true));
                }
            }
            Ok(V::Bool(false))
        }
        "ne" => {
            two(name, args)?;
            Ok(V::Bool(
                !equal(&args[0], &args[1], mixed_numbers)
                    .map_err(|e| format!("error calling ne: {e}"))?,
            ))
        }
        "lt" | "le" | "gt" | "ge" => {
            two(name, args)?;
            let ord = order(&args[0], &args[1], mixed_numbers)
                .map_err(|e| format!("error calling {name}: {e}"))?;
            use std::cmp::Ordering::*;
            Ok(V::Bool(match name {
                "lt" => ord == Less,
                "le" => ord != Greater,
                "gt" => ord == Greater,
                _ => ord != Less,
            }))
        }
        "default" => match args {
            [] => Err("wrong number of args for default: want at least 1 got 0".into()),
            [d] => Ok(d.clone()),
            [d, given, ..] => Ok(if given.truth() {
                given.clone()
            } else {
                d.clone()
            }),
        },
        "indent" | "nindent" => {
            two(name, args)?;
            let n = match &args[0] {
                V::Int(n) => *n,
                V::Float(f) if f.fract() == 0.0 => *f as i64,
                other => {
                    return Err(format!(
                        "error calling {name}: the width must be an integer, not {}",
                        other.type_name()
                    ))
                }
            };
            let pad = " ".repeat(n.clamp(0, 1024) as usize);
            let text = match &args[1] {
                V::Str(s) => s.to_string(),
                V::Missing | V::Nil => String::new(),
                other => to_v_string(other),
            };
            let indented = format!("{pad}{}", text.replace('\n', &format!("\n{pad}")));
            Ok(V::str(if name == "nindent" {
                format!("\n{indented}")
            } else {
                indented
            }))
        }
        "toYaml" => {
            one(name, args)?;
            let json = args[0].to_json();
            let yaml =
                serde_saphyr::to_string(&json).map_err(|e| format!("error calling toYaml: {e}"))?;
            Ok(V::str(yaml.trim_end_matches('\n')))
        }
        "toJson" => {
            one(name, args)?;
            serde_json::to_string(&args[0].to_json())
                .map(V::str)
                .map_err(|e| format!("error calling toJson: {e}"))
        }
        other => Err(format!("function {other:?} not defined")),
    }
}

fn one(name: &str, args: &[V]) -> Result<(), String> {
    if args.len() == 1 {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want 1 got {}",
            args.len()
        ))
    }
}

fn two(name: &str, args: &[V]) -> Result<(), String> {
    if args.len() == 2 {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want 2 got {}",
            args.len()
        ))
    }
}

fn int_arg(v: &V, what: &str) -> Result<i64, String> {
    match v {
        V::Int(i) => Ok(*i),
        other => Err(format!(
            "cannot index {what} with type {}",
            other.type_name()
        )),
    }
}

fn index(args: &[V]) -> Result<V, String> {
    let Some((first, keys)) = args.split_first() else {
        return Err("wrong number of args for index: want at least 1 got 0".into());
    };
    let mut item = first.clone();
    for key in keys {
        item = match &item {
            V::List(l) => {
                let i =
                    int_arg(key, "slice/array").map_err(|e| format!("error calling index: {e}"))?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| l.get(i))
                    .cloned()
                    .ok_or_else(|| format!("error calling index: index out of range: {i}"))?
            }
            V::Str(s) => {
                let i = int_arg(key, "string").map_err(|e| format!("error calling index: {e}"))?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| s.as_bytes().get(i))
                    .map(|b| V::Int(i64::from(*b)))
                    .ok_or_else(|| format!("error calling index: index out of range: {i}"))?
            }
            V::Map(m) => match key {
                V::Str(k) => m.get(k.as_ref()).cloned().unwrap_or(V::Missing),
                other => {
                    return Err(format!(
                        "error calling index: value has type {}; should be string",
                        other.type_name()
                    ))
                }
            },
            V::Missing | V::Nil => return Err("error calling index: index of untyped nil".into()),
            other => {
                return Err(format!(
                    "error calling index: can't index item of type {}",
                    other.type_name()
                ))
            }
        };
    }
    Ok(item)
}

fn slice(args: &[V]) -> Result<V, String> {
    let Some((first, idx)) = args.split_first() else {
        return Err("wrong number of args for slice: want at least 1 got 0".into());
    };
    if idx.len() > 3 {
        return Err(format!(
            "error calling slice: too many slice indexes: {}",
            idx.len()
        ));
    }
    let len = match first {
        V::Str(s) => s.len(),
        V::List(l) => l.len(),
        other => {
            return Err(format!(
                "error calling slice: can't slice item of type {}",
                other.type_name()
            ))
        }
    };
    let mut bounds = [0usize, len];
    for (n, i) in idx.iter().take(2).enumerate() {
        let i = int_arg(i, "slice").map_err(|e| format!("error calling slice: {e}"))?;
        let i = usize::try_from(i)
            .ok()
            .filter(|i| *i <= len)
            .ok_or_else(|| format!("error calling slice: index out of range: {i}"))?;
        bounds[n] = i;
    }
    if bounds[0] > bounds[1] {
        return Err(format!(
            "error calling slice: invalid slice index: {} > {}",
            bounds[0], bounds[1]
        ));
    }
    match first {
        V::Str(s) => s
            .get(bounds[0]..bounds[1])
            .map(V::str)
            .ok_or_else(|| "error calling slice: index not at a character boundary".into()),
        V::List(l) => Ok(V::List(Rc::new(l[bounds[0]..bounds[1]].to_vec()))),
        other => Err(format!(
            "error calling slice: can't slice item of type {}",
            other.type_name()
        )),
    }
}

/// Go's basic kinds, for comparisons.
#[derive(PartialEq, Eq, Debug)]
enum Kind {
    Invalid,
    Bool,
    Int,
    Float,
    Str,
    Other,
}

fn kind(v: &V) -> Kind {
    match v {
        V::Missing | V::Nil => Kind::Invalid,
        V::Bool(_) => Kind::Bool,
        V::Int(_) => Kind::Int,
        V::Float(_) => Kind::Float,
        V::Str(_) => Kind::Str,
        V::List(_) | V::Map(_) => Kind::Other,
    }
}

/// Both values as floats, when they are an integer and a float.
fn mixed(a: &V, b: &V) -> Option<(f64, f64)> {
    match (a, b) {
        (V::Int(x), V::Float(y)) => Some((*x as f64, *y)),
        (V::Float(x), V::Int(y)) => Some((*x, *y as f64)),
        _ => None,
    }
}

/// Go's `eq` of two values: basic kinds must match (a nil equals only nil).
fn equal(a: &V, b: &V, mixed_numbers: bool) -> Result<bool, String> {
    if let Some((x, y)) = mixed(a, b).filter(|_| mixed_numbers) {
        return Ok(x == y);
    }
    let (ka, kb) = (kind(a), kind(b));
    if ka == Kind::Other || kb == Kind::Other {
        let t = if ka == Kind::Other { a } else { b };
        return Err(format!("non-comparable type {}", t.type_name()));
    }
    if ka != kb {
        if ka == Kind::Invalid || kb == Kind::Invalid {
            return Ok(false);
        }
        return Err(format!(
            "incompatible types for comparison: {} and {}",
            a.type_name(),
            b.type_name()
        ));
    }
    Ok(match (a, b) {
        (V::Bool(x), V::Bool(y)) => x == y,
        (V::Int(x), V::Int(y)) => x == y,
        (V::Float(x), V::Float(y)) => x == y,
        (V::Str(x), V::Str(y)) => x == y,
        _ => true,
    })
}

fn order(a: &V, b: &V, mixed_numbers: bool) -> Result<std::cmp::Ordering, String> {
    if let Some((x, y)) = mixed(a, b).filter(|_| mixed_numbers) {
        return x
            .partial_cmp(&y)
            .ok_or_else(|| "invalid type for comparison".to_string());
    }
    let (ka, kb) = (kind(a), kind(b));
    if ka != kb {
        return Err(format!(
            "incompatible types for comparison: {} and {}",
            a.type_name(),
            b.type_name()
        ));
    }
    match (a, b) {
        (V::Int(x), V::Int(y)) => Ok(x.cmp(y)),
        (V::Float(x), V::Float(y)) => x
            .partial_cmp(y)
            .ok_or_else(|| "invalid type for comparison".to_string()),
        (V::Str(x), V::Str(y)) => Ok(x.cmp(y)),
        _ => Err("invalid type for comparison".into()),
    }
}

/// `fmt.Sprint`: a space between operands when neither side is a string.
pub fn sprint(args: &[V]) -> String {
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 && !matches!(a, V::Str(_)) && !matches!(args[i - 1], V::Str(_)) {
            out.push(' ');
        }
        format_v(a, &mut out);
    }
    out
}

/// `fmt.Sprintln`: spaces between all operands and a newline.
fn sprintln(args: &[V]) -> String {
    let parts: Vec<String> = args.iter().map(to_v_string).collect();
    format!("{}\n", parts.join(" "))
}

fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One `%` directive's flags, width and precision.
#[derive(Default)]
struct Spec {
    minus: bool,
    plus: bool,
    zero: bool,
    space: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

impl Spec {
    fn pad(&self, body: String, numeric: bool) -> String {
        let Some(width) = self.width else {
            return body;
        };
        let len = body.chars().count();
        if len >= width {
            return body;
        }
        let fill = width - len;
        if self.minus {
            format!("{body}{}", " ".repeat(fill))
        } else if self.zero && numeric {
            let (sign, digits) = match body.strip_prefix('-') {
                Some(d) => ("-", d.to_string()),
                None => match body.strip_prefix('+') {
                    Some(d) => ("+", d.to_string()),
                    None => ("", body.clone()),
                },
            };
            format!("{sign}{}{digits}", "0".repeat(fill))
        } else {
            format!("{}{body}", " ".repeat(fill))
        }
    }

    fn sign(&self, s: String, negative: bool) -> String {
        if negative {
            s
        } else if self.plus {
            format!("+{s}")
        } else if self.space {
            format!(" {s}")
        } else {
            s
        }
    }
}

fn bad_verb(verb: char, v: &V) -> String {
    match v {
        V::Missing | V::Nil => format!("%!{verb}(<nil>)"),
        _ => format!("%!{verb}({}={})", v.type_name(), to_v_string(v)),
    }
}

fn format_one(verb: char, spec: &Spec, v: &V) -> String {
    match (verb, v) {
        ('v', _) => spec.pad(to_v_string(v), false),
        ('s', V::Str(s)) => {
            let s: String = match spec.precision {
                Some(p) => s.chars().take(p).collect(),
                None => s.to_string(),
            };
            spec.pad(s, false)
        }
        ('s', V::List(l)) => {
            let parts: Vec<String> = l
                .iter()
                .map(|x| format_one('s', &Spec::default(), x))
                .collect();
            spec.pad(format!("[{}]", parts.join(" ")), false)
        }
        ('q', V::Str(s)) => spec.pad(go_quote(s), false),
        ('t', V::Bool(b)) => spec.pad(b.to_string(), false),
        ('d', V::Int(i)) => spec.pad(spec.sign(i.to_string(), *i < 0), true),
        ('x', V::Int(i)) => spec.pad(format!("{i:x}"), true),
        ('X', V::Int(i)) => spec.pad(format!("{i:X}"), true),
        ('o', V::Int(i)) => spec.pad(format!("{i:o}"), true),
        ('b', V::Int(i)) => spec.pad(format!("{i:b}"), true),
        ('c', V::Int(i)) => spec.pad(
            u32::try_from(*i)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}')
                .to_string(),
            false,
        ),
        ('x', V::Str(s)) => spec.pad(s.bytes().map(|b| format!("{b:02x}")).collect(), false),
        ('f' | 'F', V::Float(f)) => {
            let p = spec.precision.unwrap_or(6);
            spec.pad(spec.sign(format!("{f:.p$}"), *f < 0.0), true)
        }
        ('e' | 'E', V::Float(f)) => {
            let p = spec.precision.unwrap_or(6);
            let s = format!("{f:.p$e}");
            let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
            let e: i32 = e.parse().unwrap_or(0);
            let esign = if e < 0 { '-' } else { '+' };
            let mut s = format!("{m}e{esign}{:02}", e.abs());
            if verb == 'E' {
                s = s.to_uppercase();
            }
            spec.pad(spec.sign(s, *f < 0.0), true)
        }
        ('g' | 'G', V::Float(f)) => {
            let mut s = format_float_g(*f, spec.precision);
            if verb == 'G' {
                s = s.to_uppercase();
            }
            spec.pad(spec.sign(s, *f < 0.0), true)
        }
        _ => bad_verb(verb, v),
    }
}

/// `fmt.Sprintf` for the verbs templates use: `%v %s %q %d %t %f %e %g %x %X %o %b %c %%`,
/// flags `-+ 0`, width and precision; wrong types and missing operands print as Go prints them.
pub fn sprintf(format: &str, args: &[V]) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    let mut next = 0;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = Spec::default();
        while let Some(&f) = chars.peek() {
            match f {
                '-' => spec.minus = true,
                '+' => spec.plus = true,
                '0' => spec.zero = true,
                ' ' => spec.space = true,
                '#' => {}
                _ => break,
            }
            chars.next();
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            chars.next();
        }
        spec.width = width.parse().ok();
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut p = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                p.push(d);
                chars.next();
            }
            spec.precision = Some(p.parse().unwrap_or(0));
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        match args.get(next) {
            Some(v) => out.push_str(&format_one(verb, &spec, v)),
            None => out.push_str(&format!("%!{verb}(MISSING)")),
        }
        next += 1;
    }
    if next < args.len() {
        let extra: Vec<String> = args[next..]
            .iter()
            .map(|v| format!("{}={}", v.type_name(), to_v_string(v)))
            .collect();
        out.push_str(&format!("%!(EXTRA {})", extra.join(", ")));
    }
    out
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\0' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_matches_go() {
        let s = |x: &str| V::str(x);
        assert_eq!(
            sprintf(
                "%s:%d:%v:%05.1f",
                &[s("acme"), V::Int(7), V::Bool(true), V::Float(3.14259)]
            ),
            "acme:7:true:003.1"
        );
        assert_eq!(sprintf("%d", &[V::Float(8443.0)]), "%!d(float64=8443)");
        assert_eq!(sprintf("%d %d", &[V::Int(1)]), "1 %!d(MISSING)");
        assert_eq!(sprintf("%d", &[V::Int(1), s("x")]), "1%!(EXTRA string=x)");
        assert_eq!(
            sprintf("%-4s|%4s|%q|%%", &[s("a"), s("b"), s("c\"d")]),
            "a   |   b|\"c\\\"d\"|%"
        );
        assert_eq!(
            sprintf(
                "%x %X %o %b",
                &[V::Int(255), V::Int(255), V::Int(8), V::Int(5)]
            ),
            "ff FF 10 101"
        );
        assert_eq!(
            sprintf("%.2e %g %+d", &[V::Float(1234.5), V::Float(0.5), V::Int(3)]),
            "1.23e+03 0.5 +3"
        );
    }

    #[test]
    fn escapes_match_go() {
        assert_eq!(
            html_escape("say \"hi\" & <bye>"),
            "say &#34;hi&#34; &amp; &lt;bye&gt;"
        );
        assert_eq!(
            js_escape("say \"hi\" & <bye>"),
            "say \\\"hi\\\" \\u0026 \\u003Cbye\\u003E"
        );
        assert_eq!(
            query_escape("say \"hi\" & <bye>"),
            "say+%22hi%22+%26+%3Cbye%3E"
        );
    }

    #[test]
    fn helm_indent_and_default() {
        let r = call("nindent", &[V::Int(2), V::str("a\nb\n")], false).expect("nindent");
        assert_eq!(to_v_string(&r), "\n  a\n  b\n  ");
        let r = call("indent", &[V::Int(2), V::str("")], false).expect("indent");
        assert_eq!(to_v_string(&r), "  ");
        for empty in [V::Missing, V::Nil, V::Bool(false), V::Int(0), V::str("")] {
            let r = call("default", &[V::str("d"), empty], false).expect("default");
            assert_eq!(to_v_string(&r), "d");
        }
        let r = call(
            "toYaml",
            &[V::from_json(
                &serde_json::json!({"b": [1, 2], "a": {"c": "x"}}),
                crate::value::Numbers::Exact,
            )],
            false,
        )
        .expect("toYaml");
        assert_eq!(to_v_string(&r), "a:\n  c: x\nb:\n- 1\n- 2");
    }
}
