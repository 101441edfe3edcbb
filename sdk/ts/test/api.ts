// The listing of the package's exported API (api.txt), made from the
// compiled declarations (dist/src/index.d.ts) with the TypeScript compiler
// API: one sorted line per exported name and per member of each exported
// class, interface and object constant, and per member of a union type, so
// that adding a member is a line added and removing or changing one is a
// line gone.

import ts from "typescript";

/** exportedAPI lists the exports of the declaration file entry. */
export function exportedAPI(entry: string): string[] {
  const program = ts.createProgram([entry], { noEmit: true, types: [], lib: ["lib.es2022.d.ts", "lib.dom.d.ts"] });
  const checker = program.getTypeChecker();
  const sf = program.getSourceFile(entry);
  if (sf === undefined) {
    throw new Error(`${entry}: not found`);
  }
  const mod = checker.getSymbolAtLocation(sf);
  if (mod === undefined) {
    throw new Error(`${entry}: not a module`);
  }
  const printer = ts.createPrinter({ removeComments: true });
  const show = (n: ts.Node): string =>
    printer
      .printNode(ts.EmitHint.Unspecified, n, n.getSourceFile())
      .replace(/\s+/g, " ")
      .replace(/^(export )?(declare )?/, "")
      .replace(/;$/, "")
      .trim();
  const lines: string[] = [];
  const members = (kind: string, name: string, ms: ts.NodeArray<ts.Node>) => {
    for (const m of ms) {
      const mn = (m as { name?: ts.Node }).name;
      if (mn !== undefined && ts.isPrivateIdentifier(mn)) {
        continue;
      }
      if (ts.canHaveModifiers(m) && ts.getModifiers(m)?.some((x) => x.kind === ts.SyntaxKind.PrivateKeyword)) {
        continue;
      }
      lines.push(`${kind} ${name}: ${show(m)}`);
    }
  };
  const heritage = (hs: ts.NodeArray<ts.HeritageClause> | undefined) => (hs && hs.length > 0 ? " " + hs.map(show).join(" ") : "");
  for (const exp of checker.getExportsOfModule(mod)) {
    const name = exp.getName();
    const sym = exp.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exp) : exp;
    for (const d of sym.declarations ?? []) {
      if (ts.isClassDeclaration(d)) {
        lines.push(`class ${name}${heritage(d.heritageClauses)}`);
        members("member", name, d.members);
      } else if (ts.isInterfaceDeclaration(d)) {
        lines.push(`interface ${name}${heritage(d.heritageClauses)}`);
        members("member", name, d.members);
      } else if (ts.isTypeAliasDeclaration(d)) {
        if (ts.isUnionTypeNode(d.type)) {
          lines.push(`type ${name} union`);
          for (const t of d.type.types) {
            lines.push(`type ${name} | ${show(t)}`);
          }
        } else {
          lines.push(`type ${name} = ${show(d.type)}`);
        }
      } else if (ts.isFunctionDeclaration(d)) {
        lines.push(show(d));
      } else if (ts.isVariableDeclaration(d)) {
        const kind = d.parent.flags & ts.NodeFlags.Const ? "const" : "let";
        let t = d.type;
        if (t !== undefined && ts.isTypeOperatorNode(t) && t.operator === ts.SyntaxKind.ReadonlyKeyword) {
          t = t.type;
        }
        if (t !== undefined && ts.isTypeLiteralNode(t)) {
          lines.push(`${kind} ${name} object`);
          members("member", name, t.members);
        } else if (t !== undefined && ts.isTupleTypeNode(t)) {
          lines.push(`${kind} ${name} tuple`);
          for (const e of t.elements) {
            lines.push(`${kind} ${name} [] ${show(e)}`);
          }
        } else {
          lines.push(`${kind} ${name}: ${t ? show(t) : "unknown"}`);
        }
      } else {
        lines.push(`${ts.SyntaxKind[d.kind]} ${name}`);
      }
    }
  }
  return [...new Set(lines)].sort();
}

/** readListing is the lines of an api.txt: blank lines and # comments left out. */
export function readListing(text: string): string[] {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"));
}
