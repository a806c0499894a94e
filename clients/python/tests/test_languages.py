"""The default sandbox image runs code in seven languages with no custom image (Go both built and with `go run`): each program
is sent as a file, compiled in the sandbox where the language compiles, and run."""

import unittest
import uuid

from support import JOB, SEED, URL, run
from tangram_client import Tangram

# (language, files, one shell command that builds and runs it). Each prints "<lang> 42".
PROGRAMS = [
    ("python", {"main.py": "print('python', 6 * 7)\n"}, "python3 main.py"),
    ("c", {"main.c": '#include <stdio.h>\nint main(void) { printf("c %d\\n", 6 * 7); return 0; }\n'},
     "gcc -O2 -o main_c main.c && ./main_c"),
    ("cpp", {"main.cpp": "#include <iostream>\n#include <numeric>\n#include <vector>\n"
                         "int main() { std::vector<int> v{20, 22};\n"
                         "  std::cout << \"cpp \" << std::accumulate(v.begin(), v.end(), 0) << \"\\n\"; }\n"},
     "g++ -O2 -o main_cpp main.cpp && ./main_cpp"),
    ("java", {"Main.java": "public class Main {\n  public static void main(String[] a) {\n"
                           "    System.out.println(\"java \" + (6 * 7));\n  }\n}\n"},
     "javac Main.java && java Main"),
    ("go", {"go/go.mod": "module example.com/answer\n\ngo 1.19\n",
            "go/main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"go\", 6*7) }\n"},
     "cd go && go build -o ../main_go . && cd .. && ./main_go"),
    # `go run` builds its program in Go's temporary directory: /tmp is noexec in a sandbox,
    # so the image points GOTMPDIR at /work (regression: "fork/exec /tmp/go-build...: permission denied").
    ("go-run", {"run/main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"go-run\", 6*7) }\n"},
     "go run run/main.go"),
    ("node", {"main.js": "console.log('node', [20, 22].reduce((a, b) => a + b));\n"}, "node main.js"),
    ("rust", {"main.rs": "fn main() { let v: u32 = (20..=22).step_by(2).sum(); println!(\"rust {v}\"); }\n"},
     "rustc -O -o main_rs main.rs && ./main_rs"),
]


class LanguagesTest(unittest.TestCase):
    def test_the_default_image_compiles_and_runs_each_language(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as client:
                traj = "langs-" + uuid.uuid4().hex[:8]
                async with await client.open_sandbox(trajectory=traj) as sandbox:
                    for lang, files, command in PROGRAMS:
                        with self.subTest(lang=lang):
                            r = await sandbox.exec(["sh", "-c", command], cpus=(1, 2), timeout_s=120,
                                                   files=files)
                            self.assertEqual((r.exit_code, r.stdout), (0, f"{lang} 42\n"),
                                             f"{lang}: {r.stderr}")
        run(go(), bound_s=600)


if __name__ == "__main__":
    unittest.main()
