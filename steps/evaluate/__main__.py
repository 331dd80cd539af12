from steps.evaluate.step import main

raise SystemExit(main())
