//! Rendering a workspace tree with box-drawing branches.

/// One workspace and the workspaces below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub label: String,
    pub children: Vec<Node>,
}

impl Node {
    pub fn new(label: impl Into<String>, children: Vec<Node>) -> Node {
        Node {
            label: label.into(),
            children,
        }
    }
}

/// Renders `top` below a `.` line:
///
/// ```text
/// .
/// └── root
///     ├── orgs
///     │   └── acme
///     └── providers
/// ```
pub fn render(top: &Node) -> String {
    let mut out = String::from(".\n");
    write_node(&mut out, top, "", true);
    out
}

fn write_node(out: &mut String, node: &Node, indent: &str, last: bool) {
    out.push_str(indent);
    out.push_str(if last { "└── " } else { "├── " });
    out.push_str(&node.label);
    out.push('\n');
    let deeper = format!("{indent}{}", if last { "    " } else { "│   " });
    let n = node.children.len();
    for (i, child) in node.children.iter().enumerate() {
        write_node(out, child, &deeper, i + 1 == n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(s: &str) -> Node {
        Node::new(s, vec![])
    }

    #[test]
    fn single() {
        assert_eq!(render(&leaf("root:orgs:acme")), ".\n└── root:orgs:acme\n");
    }

    #[test]
    fn nested() {
        let tree = Node::new(
            "root",
            vec![
                Node::new(
                    "orgs",
                    vec![Node::new("acme", vec![leaf("team-a")]), leaf("beta")],
                ),
                leaf("platform-mesh-system"),
                leaf("providers"),
            ],
        );
        let want = "\
.
└── root
    ├── orgs
    │   ├── acme
    │   │   └── team-a
    │   └── beta
    ├── platform-mesh-system
    └── providers
";
        assert_eq!(render(&tree), want);
    }
}
