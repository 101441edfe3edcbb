// Rewrites api.txt from the compiled declarations: `npm run api`, in the
// change that grows the API (api.test.ts holds it to growing only).

import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { exportedAPI } from "./api.js";

const header = [
  "# The exported API of @torpor/sdk, from dist/src/index.d.ts (npm run api rewrites it).",
  "# It only grows: test/api.test.ts fails when a line here is gone or changed.",
];
const lines = exportedAPI(fileURLToPath(new URL("../src/index.d.ts", import.meta.url)));
writeFileSync(new URL("../../api.txt", import.meta.url), [...header, ...lines].join("\n") + "\n");
