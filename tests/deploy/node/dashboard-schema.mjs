// Prints a JSON Schema (draft-07) of Grafana's `Dashboard` type: the classic dashboard JSON
// that Grafana's file provisioning loads. The schema is generated from the TypeScript types
// Grafana publishes in the npm package @grafana/schema (raw/dashboard/x/types.gen.d.ts), so
// it follows the pinned Grafana version. Interfaces are closed (additionalProperties false):
// a misspelt or unknown field fails validation.
import { fileURLToPath } from "node:url";
import { createGenerator } from "ts-json-schema-generator";

const types = fileURLToPath(
  new URL("./node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts", import.meta.url),
);
const generator = createGenerator({
  path: types,
  type: "Dashboard",
  skipTypeCheck: true, // the .d.ts is Grafana's published output; checking it adds nothing
  additionalProperties: false,
  expose: "export",
  topRef: true,
});
process.stdout.write(JSON.stringify(generator.createSchema("Dashboard"), null, 1));
