// A JSON value as YAML, for reading a spec (block style; strings quoted when YAML would misread them).

const PLAIN = /^[A-Za-z_][A-Za-z0-9_.\/-]*( [A-Za-z0-9_.\/-]+)*$/;
const RESERVED = /^(true|false|yes|no|on|off|null|~|y|n)$/i;

function scalar(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  const s = String(v);
  if (PLAIN.test(s) && !RESERVED.test(s)) return s;
  return JSON.stringify(s);
}

function isEmpty(v) {
  return v !== null && typeof v === "object" && Object.keys(v).length === 0;
}

export function toYaml(value, indent = "") {
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return value
      .map((item) => {
        if (item !== null && typeof item === "object" && !isEmpty(item)) {
          const inner = toYaml(item, indent + "  ");
          return `${indent}- ${inner.slice(indent.length + 2)}`;
        }
        return `${indent}- ${isEmpty(item) ? (Array.isArray(item) ? "[]" : "{}") : scalar(item)}`;
      })
      .join("\n");
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value);
    if (!keys.length) return "{}";
    return keys
      .map((k) => {
        const v = value[k];
        const key = scalar(k);
        if (v !== null && typeof v === "object" && !isEmpty(v)) return `${indent}${key}:\n${toYaml(v, indent + "  ")}`;
        return `${indent}${key}: ${isEmpty(v) ? (Array.isArray(v) ? "[]" : "{}") : scalar(v)}`;
      })
      .join("\n");
  }
  return indent + scalar(value);
}
