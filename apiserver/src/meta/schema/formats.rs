//! String `format` checks, following the formats kube-apiserver validates for
//! custom resources (kube-openapi `strfmt` registry).
//!
//! Checked: `byte` (standard base64), `date-time`/`datetime`, `date`,
//! `duration`, `uuid`/`uuid3`/`uuid4`/`uuid5`, `ipv4`, `ipv6`, `cidr`, `mac`,
//! `hostname`, `email`, `uri`, `hexcolor`, `rgbcolor`, `bsonobjectid`, `ssn`.
//! Every other format (including `int32`, `int64`, `float`, `double`,
//! `password`) is accepted as kube does: numeric formats are not range-checked
//! by kube's OpenAPI validator. Checks lean lenient where kube's parser is.

use std::net::{Ipv4Addr, Ipv6Addr};

use base64::Engine as _;

/// True when `s` satisfies `format` (unknown formats always pass).
pub(crate) fn check(format: &str, s: &str) -> bool {
    match format {
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "date-time" | "datetime" => is_date_time(s),
        "date" => is_date(s),
        "duration" => is_duration(s),
        "uuid" => is_uuid(s, None),
        "uuid3" => is_uuid(s, Some('3')),
        "uuid4" => is_uuid(s, Some('4')),
        "uuid5" => is_uuid(s, Some('5')),
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "hostname" => is_hostname(s),
        "email" => is_email(s),
        "uri" => !s.chars().any(|c| c.is_control()),
        "hexcolor" => is_hexcolor(s),
        "rgbcolor" => is_rgbcolor(s),
        "bsonobjectid" => s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "ssn" => is_ssn(s),
        _ => true,
    }
}

fn digits(s: &str, n: usize) -> Option<u32> {
    if s.len() == n && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

fn is_leap(y: u32) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

/// `YYYY-MM-DD`, a real calendar date.
fn is_date(s: &str) -> bool {
    let mut parts = s.split('-');
    let (Some(y), Some(m), Some(d), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(y), Some(m), Some(d)) = (digits(y, 4), digits(m, 2), digits(d, 2)) else {
        return false;
    };
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// RFC 3339 date-time plus the ISO 8601 variants kube's `strfmt` accepts:
/// `T`/`t`/space separator, optional seconds and fraction, zone `Z`,
/// `±hh:mm`, `±hhmm` or none.
fn is_date_time(s: &str) -> bool {
    if s.len() < 16 || !s.is_char_boundary(10) || !s.is_char_boundary(11) {
        return false;
    }
    let (date, rest) = s.split_at(10);
    if !is_date(date) {
        return false;
    }
    let mut rest = match rest.as_bytes().first() {
        Some(b'T' | b't' | b' ') => &rest[1..],
        _ => return false,
    };
    // Time zone suffix.
    if let Some(r) = rest.strip_suffix(['Z', 'z']) {
        rest = r;
    } else if let Some(pos) = rest.rfind(['+', '-']) {
        let zone = &rest[pos + 1..];
        let ok = zone.is_ascii()
            && match zone.len() {
                5 => {
                    zone.as_bytes()[2] == b':'
                        && digits(&zone[..2], 2).is_some_and(|h| h < 24)
                        && digits(&zone[3..], 2).is_some_and(|m| m < 60)
                }
                4 => {
                    digits(&zone[..2], 2).is_some_and(|h| h < 24)
                        && digits(&zone[2..], 2).is_some_and(|m| m < 60)
                }
                _ => false,
            };
        if !ok {
            return false;
        }
        rest = &rest[..pos];
    }
    let (hms, frac) = match rest.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (rest, None),
    };
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    let parts: Vec<&str> = hms.split(':').collect();
    let limits = [24, 60, 61];
    if !(2..=3).contains(&parts.len()) || (frac.is_some() && parts.len() != 3) {
        return false;
    }
    parts
        .iter()
        .zip(limits)
        .all(|(p, lim)| digits(p, 2).is_some_and(|v| v < lim))
}

/// Go `time.ParseDuration` syntax plus `strfmt`'s long unit names and days /
/// weeks, e.g. `1h30m`, `1.5h`, `-2s`, `3 days`, `0`.
fn is_duration(s: &str) -> bool {
    let s = s.trim();
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body == "0" {
        return true;
    }
    if body.is_empty() {
        return false;
    }
    const UNITS: &[&str] = &[
        "nanoseconds",
        "nanosecond",
        "ns",
        "microseconds",
        "microsecond",
        "us",
        "µs",
        "μs",
        "milliseconds",
        "millisecond",
        "ms",
        "seconds",
        "second",
        "sec",
        "s",
        "minutes",
        "minute",
        "min",
        "m",
        "hours",
        "hour",
        "hr",
        "h",
        "days",
        "day",
        "d",
        "weeks",
        "week",
        "wk",
        "w",
    ];
    let mut rest = body;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return false;
        }
        rest = rest[num_len..].trim_start();
        let Some(unit) = UNITS.iter().find(|u| rest.starts_with(**u)) else {
            return false;
        };
        rest = rest[unit.len()..].trim_start();
    }
    true
}

fn is_uuid(s: &str, version: Option<char>) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    let shape_ok = groups.len() == 5
        && groups
            .iter()
            .zip(lens)
            .all(|(g, l)| g.len() == l && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if !shape_ok {
        return false;
    }
    match version {
        None => true,
        Some(v) => {
            let variant_ok = matches!(
                groups[3].as_bytes()[0].to_ascii_lowercase(),
                b'8' | b'9' | b'a' | b'b'
            );
            groups[2].starts_with(v) && (v == '3' || variant_ok)
        }
    }
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Some(bits) = digits(bits, bits.len()).filter(|_| !bits.is_empty() && bits.len() <= 3)
    else {
        return false;
    };
    if ip.parse::<Ipv4Addr>().is_ok() {
        bits <= 32
    } else if ip.parse::<Ipv6Addr>().is_ok() {
        bits <= 128
    } else {
        false
    }
}

/// Go `net.ParseMAC`: 6, 8 or 20 octets as `aa:bb:..`, `aa-bb-..` or
/// `aabb.ccdd.eeff`.
fn is_mac(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let ok_len = |octets: usize| matches!(octets, 6 | 8 | 20);
    for sep in [':', '-'] {
        if s.contains(sep) {
            let parts: Vec<&str> = s.split(sep).collect();
            return ok_len(parts.len()) && parts.iter().all(|p| hex(p, 2));
        }
    }
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() > 1 && ok_len(parts.len() * 2) && parts.iter().all(|p| hex(p, 4))
}

fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() || s.len() > 255 {
        return false;
    }
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    })
}

/// Lenient `net/mail.ParseAddress`-style check: `local@domain`, optionally
/// wrapped as `Name <local@domain>`.
fn is_email(s: &str) -> bool {
    let addr = match (s.rfind('<'), s.strip_suffix('>')) {
        (Some(i), Some(inner)) if i < inner.len() => &inner[i + 1..],
        _ => s,
    };
    match addr.rsplit_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && !domain.is_empty()
                && !addr.chars().any(|c| c.is_whitespace() || c.is_control())
                && !domain.starts_with('.')
                && !domain.ends_with('.')
        }
        None => false,
    }
}

fn is_hexcolor(s: &str) -> bool {
    let h = s.strip_prefix('#').unwrap_or(s);
    matches!(h.len(), 3 | 6) && h.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_rgbcolor(s: &str) -> bool {
    let Some(inner) = s.strip_prefix("rgb(").and_then(|r| r.strip_suffix(')')) else {
        return false;
    };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            (1..=3).contains(&p.len())
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u32>().is_ok_and(|v| v <= 255)
        })
}

fn is_ssn(s: &str) -> bool {
    let d: String = s.chars().filter(|c| !matches!(c, '-' | ' ')).collect();
    d.len() == 9 && d.bytes().all(|b| b.is_ascii_digit()) && s.len() <= 11
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn formats_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("byte", "aGVsbG8=", true),
            ("byte", "not base64!", false),
            ("date-time", "2024-05-01T10:20:30Z", true),
            ("date-time", "2024-05-01T10:20:30.123+02:00", true),
            ("date-time", "2024-05-01 10:20:30", true),
            ("date-time", "2024-02-30T10:20:30Z", false),
            ("date-time", "yesterday", false),
            ("date-time", "2024-05-01T25:00:00Z", false),
            ("date", "2024-02-29", true),
            ("date", "2023-02-29", false),
            ("date", "2024-5-1", false),
            ("duration", "1h30m", true),
            ("duration", "1.5h", true),
            ("duration", "3 days", true),
            ("duration", "0", true),
            ("duration", "soon", false),
            ("duration", "10", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "123e4567e89b12d3a456426614174000", false),
            ("uuid4", "123e4567-e89b-42d3-a456-426614174000", true),
            ("uuid4", "123e4567-e89b-12d3-a456-426614174000", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "10.0.0.256", false),
            ("ipv6", "fe80::1", true),
            ("ipv6", "10.0.0.1", false),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "fd00::/64", true),
            ("cidr", "10.0.0.0/33", false),
            ("cidr", "10.0.0.0", false),
            ("mac", "00:1a:2b:3c:4d:5e", true),
            ("mac", "001a.2b3c.4d5e", true),
            ("mac", "00:1a:2b", false),
            ("hostname", "example.com", true),
            ("hostname", "-bad.example.com", false),
            ("email", "jane@example.com", true),
            ("email", "Jane <jane@example.com>", true),
            ("email", "jane", false),
            ("hexcolor", "#ff00ff", true),
            ("hexcolor", "#ff00f", false),
            ("rgbcolor", "rgb(255, 0, 10)", true),
            ("rgbcolor", "rgb(256,0,0)", false),
            ("int32", "anything", true),
            ("password", "x", true),
            ("made-up", "x", true),
        ];
        for (format, value, want) in cases {
            assert_eq!(check(format, value), *want, "{format} {value:?}");
        }
    }
}
