"""The end of a compare_*.py run: the accepted differences, the others, one summary line."""


def finish(note_label, notes, diffs, summary):
    for n in notes:
        print(f"{note_label}:", n)
    for d in diffs:
        print("DIFF:", d)
    print(summary)
    return 1 if diffs else 0
