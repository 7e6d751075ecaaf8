// What the MCP tests share: the reference MCP server (@modelcontextprotocol/server-everything over stdio, from
// scripts/node_modules, or the folder PARLEY_MCP_EVERYTHING names) and a scripted synthetic model (tools/mkgguf -script:
// stories260K's vocabulary, a few small layers) whose greedy reply calls get-sum(19, 23) and, once it reads the tool's
// result, answers ANSWER: the whole loop runs through llama.cpp.
import { execFileSync } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { ROOT, MODEL } from './parley-server.mjs';

export const ANSWER = 'The server worked it out.';
export const EVERYTHING = path.join(process.env.PARLEY_MCP_EVERYTHING ||
  path.join(ROOT, 'scripts', 'node_modules', '@modelcontextprotocol', 'server-everything'), 'dist', 'index.js');

// writeToolCallingModel writes the scripted model into dir and returns its path.
export async function writeToolCallingModel(dir) {
  const script = path.join(dir, 'script.json');
  await writeFile(script, JSON.stringify({
    template: "{% if tools %}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
      "{% if add_generation_prompt %}{% if messages[-1].role == 'tool' %}<|im_start|>assistant<|answer|>" +
      '{% else %}<|im_start|>assistant\n{% endif %}{% endif %}',
    control: ['<|im_start|>', '<|im_end|>', '<|answer|>'], text: ['<tool_call>', '</tool_call>'], after: '\n',
    reply: '<tool_call>{"name": "get-sum", "arguments": {"a": 19, "b": 23}}</tool_call>', end: '<|im_end|>',
    then: [{ after: '<|answer|>', reply: ANSWER }],
  }));
  const model = path.join(dir, 'tools-scripted.gguf');
  execFileSync('go', ['run', './tools/mkgguf', '-script', script, '-o', model, '-vocab', MODEL, '-layers', '3', '-dim', '128',
    '-heads', '4', '-kv-heads', '2', '-ffn', '256', '-ctx', '2048'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  return model;
}

// writeEverythingConfig writes an --mcp-config into dir that runs the reference server for every user, with the given
// tools, and returns its path.
export async function writeEverythingConfig(dir, tools) {
  const config = path.join(dir, 'mcp.json');
  await writeFile(config, JSON.stringify({
    servers: { everything: { command: 'node', args: [EVERYTHING, 'stdio'] } },
    users: { '*': { everything: tools } },
  }));
  return config;
}
