"""A GAIA-format sample folder, as gaia-benchmark/GAIA lays one out (2023/<split>/metadata.jsonl
with the attached files beside it), written in tmp_path by the GAIA tests.  The records are
made up here (GAIA's own must not be reshared); their fields and forms are GAIA's: a UUID
task_id, Question, Level, "Final answer" ("?" on the test split), file_name ("" when none),
Annotator Metadata."""
import json
from pathlib import Path

VALIDATION = [
    {"task_id": "c61d22de-5f6c-4958-a7f6-5e9707bd3466", "Question": "What is the sum of the column 'n' in the attached file?",
     "Level": 2, "Final answer": "42", "file_name": "c61d22de-5f6c-4958-a7f6-5e9707bd3466.csv",
     "Annotator Metadata": {"Steps": "1. Open the file. 2. Add the column.", "Number of steps": "2",
                            "How long did this take?": "1 minute", "Tools": "1. Python", "Number of tools": "1"}},
    {"task_id": "17b5a6a3-bc87-42e8-b0fb-6ab0781ef2cc", "Question": "Which city hosts the Louvre?",
     "Level": 1, "Final answer": "Paris", "file_name": "",
     "Annotator Metadata": {"Steps": "Search.", "Number of steps": "1", "How long did this take?": "1 minute",
                            "Tools": "1. Web browser", "Number of tools": "1"}},
    {"task_id": "04a04a9b-226c-43fd-b319-d5e89743676f", "Question": "List the first three primes, in order.",
     "Level": 1, "Final answer": "2, 3, 5", "file_name": "",
     "Annotator Metadata": {"Steps": "Recall.", "Number of steps": "1", "How long did this take?": "1 minute",
                            "Tools": "None", "Number of tools": "0"}},
    {"task_id": "5a0c1adf-205e-4841-a666-7c3ef95def9d", "Question": "What word is written in the attached text file?",
     "Level": 3, "Final answer": "seagull", "file_name": "5a0c1adf-205e-4841-a666-7c3ef95def9d.txt",
     "Annotator Metadata": {"Steps": "Read it.", "Number of steps": "1", "How long did this take?": "1 minute",
                            "Tools": "1. Text reader", "Number of tools": "1"}},
]
TEST = [
    {"task_id": "e1fc63a2-da7a-432f-be78-7c4a95598703", "Question": "How many rows has the attached file?",
     "Level": 1, "Final answer": "?", "file_name": "e1fc63a2-da7a-432f-be78-7c4a95598703.csv"},
    {"task_id": "8e867cd7-cff9-4e6c-867a-ff5ddc2550be", "Question": "Which river flows through Vienna?",
     "Level": 2, "Final answer": "?", "file_name": ""},
]
ATTACHMENTS = {"c61d22de-5f6c-4958-a7f6-5e9707bd3466.csv": "n\n40\n2\n",
               "5a0c1adf-205e-4841-a666-7c3ef95def9d.txt": "sea gull\n",
               "e1fc63a2-da7a-432f-be78-7c4a95598703.csv": "x\n1\n2\n3\n"}


def write_gaia(root: Path, splits=("validation", "test")) -> Path:
    """Write `root`/2023/<split>/metadata.jsonl and the attached files; return `root`."""
    for split in splits:
        folder = root / "2023" / split
        folder.mkdir(parents=True, exist_ok=True)
        rows = VALIDATION if split == "validation" else TEST
        (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        for row in rows:
            if row["file_name"]:
                (folder / row["file_name"]).write_text(ATTACHMENTS[row["file_name"]])
    return root
