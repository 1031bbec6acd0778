//! Every upstream sample of a Platform Mesh kind is accepted unchanged by `kubectl apply` and
//! comes back from `kubectl get -o yaml` with every field it had.

mod common;

use std::path::{Path, PathBuf};

use common::{kubectl_binary, Kubectl, Server};
use serde_json::Value;

const KINDS: &[&str] = &[
    "PlatformMesh",
    "Provider",
    "ManagedProvider",
    "Account",
    "AccountInfo",
    "AcceptAPI",
    "Migration",
    "MigrationConfiguration",
];

fn reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            out.push(p);
        }
    }
}

/// Samples: YAML documents of our kinds outside the CRD folders.
fn samples() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    yaml_files(&reference(), &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read sample");
        for doc in text.split("\n---") {
            let Ok(v) = serde_saphyr::from_str::<Value>(doc) else {
                continue;
            };
            let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
            let group_ok = v
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|a| a.contains("platform-mesh.io"));
            if KINDS.contains(&kind) && group_ok {
                out.push((f.clone(), v));
            }
        }
    }
    out
}

/// Whether every field of `want` is in `got` with the same value.
fn contains(got: &Value, want: &Value, path: &str) -> Result<(), String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let gv = g.get(k).ok_or_else(|| format!("{path}.{k} is missing"))?;
                contains(gv, wv, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                contains(gv, wv, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        (g, w) if g == w => Ok(()),
        (Value::Number(g), Value::Number(w)) if g.as_f64() == w.as_f64() => Ok(()),
        (g, w) => Err(format!("{path}: got {g}, want {w}")),
    }
}

#[test]
fn upstream_samples_round_trip_through_kubectl() {
    let samples = samples();
    assert!(
        samples.len() >= 6,
        "expected the upstream samples, found {}",
        samples.len()
    );
    let bin = kubectl_binary("1.33").expect("kubectl.1.33");
    let server = Server::start();
    let k = Kubectl::new(bin, &server.kubeconfig);
    for (file, sample) in samples {
        let yaml = serde_saphyr::to_string(&sample).expect("yaml");
        if let Some(ns) = sample["metadata"]["namespace"].as_str() {
            let _ = k.run(&["create", "namespace", ns]);
        }
        let applied = k.run_stdin(&["apply", "-f", "-"], &yaml);
        assert!(
            applied.status.success(),
            "{} refused: {}",
            file.display(),
            String::from_utf8_lossy(&applied.stderr)
        );
        let kind = sample["kind"].as_str().expect("kind").to_lowercase();
        let group = sample["apiVersion"]
            .as_str()
            .expect("apiVersion")
            .split('/')
            .next()
            .unwrap_or("")
            .to_string();
        let name = sample["metadata"]["name"].as_str().expect("name");
        let mut args = vec![
            "get".to_string(),
            format!("{kind}.{group}"),
            name.to_string(),
            "-o".into(),
            "json".into(),
        ];
        if let Some(ns) = sample["metadata"]["namespace"].as_str() {
            args.extend(["-n".to_string(), ns.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let got: Value = serde_json::from_str(&k.ok(&args)).expect("json");
        if let Err(e) = contains(&got, &sample, "") {
            panic!("{} lost a field in the round trip: {e}", file.display());
        }
        let again = k.ok_stdin(&["apply", "-f", "-"], &yaml);
        assert!(
            again.contains("unchanged"),
            "{}: second apply: {again}",
            file.display()
        );
    }
}
